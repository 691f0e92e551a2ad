package device

// GraphCapture is a Stream whose work can be recorded into a graph and replayed by one launch (CUDA stream capture:
// cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiate, cuGraphLaunch). Between BeginCapture and EndCapture
// the stream's copies between device addresses, memsets and launches are recorded, not run; Record, Wait,
// Synchronize and copies from or to host memory fail. EndCapture ends the capture and instantiates what was
// recorded; LaunchGraph enqueues a whole instantiated graph of the same GPU and context on the stream, as one
// operation. Backends whose streams do not implement it replay recorded work call by call instead (package
// remoting).
type GraphCapture interface {
	BeginCapture() error
	EndCapture() (GraphExec, error)
	LaunchGraph(g GraphExec) error
}

// GraphExec is an instantiated graph of one GPU and context.
type GraphExec interface {
	Destroy() error
}
