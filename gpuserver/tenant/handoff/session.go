package handoff

import "github.com/faas-gpu/faas-gpu/gpuserver/pool"

// The session hand-off: once the gpuserver has checked a remoting hello (magic and version, the function's token,
// its session limit, the ring memfd's seals and layout), it sends KindSession to the function's tenant executor
// with two descriptors, the connection and the ring's memfd, and closes its own copies. The executor answers the
// hello and runs the session; records then flow from the function's ring straight into the executor. It answers
// the KindSession request once it adopted the session (or an error: the gpuserver then refuses the hello), and
// reports the session's end with a one-way KindSessionEnded.
const (
	KindSession      Kind = 10
	KindSessionEnded Kind = 11
)

// Session is an authenticated remoting connection. Files: [connection, ring memfd].
type Session struct {
	// ID names the session in SessionEnded.
	ID       uint64            `json:"id"`
	Function string            `json:"function"`
	Spec     pool.FunctionSpec `json:"spec"`
	// PID is the function process's, as its hello said.
	PID int `json:"pid"`
	// ShmSize is the ring memfd's size, as the hello said (checked again by the executor).
	ShmSize uint64 `json:"shm_size"`
}

// SessionEnded reports the end of a session (one-way).
type SessionEnded struct {
	ID       uint64 `json:"id"`
	Function string `json:"function"`
}
