package handlers

import (
	"net/http"
	"testing"
)

// A deploy or update naming the dead letters' stream as its queue is refused with 400 naming the
// annotation (it made the queue worker consume its own dead letters); so is a queue name NATS cannot carry.
func TestDeployRefusesReservedOrBadQueue(t *testing.T) {
	f := newFixture(t)
	for _, q := range []string{"faas-dead-letter", "faas-dead-letter-x", "a.b", "a>"} {
		fd := deployment("echo")
		fd.Annotations = &map[string]string{"com.openfaas.queue": q}
		f.expect(t, http.MethodPost, "/system/functions", fd, http.StatusBadRequest, "annotation com.openfaas.queue")
		f.expect(t, http.MethodPut, "/system/functions", fd, http.StatusBadRequest, "annotation com.openfaas.queue")
	}
	fd := deployment("echo")
	fd.Annotations = &map[string]string{"com.openfaas.queue": "gpu-batch"}
	f.deploy(t, fd)
}
