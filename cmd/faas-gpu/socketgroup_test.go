package main

import (
	"strconv"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// TestSocketGroupDefault: a gpuserver run as root without -socket-group gives its sockets the group of the
// standalone provider's sandboxed functions (else their shim cannot connect: cuInit answers CUDA_ERROR_NO_DEVICE);
// as another user, or with -socket-group none, the sockets stay the owner's; a named group is kept.
func TestSocketGroupDefault(t *testing.T) {
	for _, c := range []struct {
		flag string
		euid int
		want string
	}{
		{"", 0, strconv.Itoa(sandbox.DefaultFirstID)},
		{"", 1000, ""},
		{"none", 0, ""},
		{"2042", 0, "2042"},
		{"video", 1000, "video"},
	} {
		if got := socketGroup(c.flag, c.euid); got != c.want {
			t.Errorf("-socket-group %q as uid %d: %q, want %q", c.flag, c.euid, got, c.want)
		}
	}
}
