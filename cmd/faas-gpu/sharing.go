package main

import "flag"

// sharingFlag is --compute-sharing, shared by `up` and `gpuserver` (server.Config.ComputeSharing).
type sharingFlag struct{ on bool }

func (s *sharingFlag) register(fs *flag.FlagSet) {
	fs.BoolVar(&s.on, "compute-sharing", true,
		"functions annotated with a compute share (com.openfaas.gpu.compute.request below 1) co-run on a GPU, each "+
			"held to its share by the gate in its executor's launch path; functions without one stay exclusive. "+
			"false binds every function exclusively (docs/operations.md)")
}
