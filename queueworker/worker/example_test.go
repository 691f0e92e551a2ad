package worker_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// The asynchronous path on one machine, as `faas-gpu up` composes it: an embedded JetStream server, the front
// door on the gateway's mux, and the worker invoking functions through the gateway, admitting GPU functions by
// the gpuserver pool's capacity.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	password := natsserver.RandomPassword() // `faas-gpu up` keeps it in <state>/secrets/nats-password
	ns, err := natsserver.Start(ctx, natsserver.Config{StoreDir: ".faas-gpu/jetstream", Port: -1,
		Username: "faas-gpu", Password: password})
	if err != nil {
		log.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("faas-gpu", password), nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if err := frontdoor.EnsureStreams(ctx, js); err != nil {
		log.Fatal(err)
	}
	gateway := "http://127.0.0.1:8080"
	fns := functions.NewGateway(functions.GatewayConfig{URL: gateway}) // `up` reads its backend: functions.NewCache
	mux := http.NewServeMux()
	mux.Handle("/async-function/", frontdoor.New(frontdoor.Config{JetStream: js, Functions: fns}))
	// ... the provider's routes on the same mux, served on :8080 ...

	w, err := worker.New(worker.Config{
		JetStream:  js,
		GatewayURL: gateway,
		Functions:  fns,
		Capacity:   client.New("/run/faas-gpu/gpuserver.sock"),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil { // returns after a graceful drain once ctx ends
		log.Fatal(err)
	}
}
