package pool

import (
	"fmt"
	"strings"
)

// Instances (docs/design.md, decision 10).
//
// A function serves as many requests at once as it has instances: its replicas, each a process of its own with its
// own shim session. Each instance initialises its own device memory at addresses of its own (its own address space
// in its tenant's window), so every instance's blocks can be mapped on a different GPU at the same moment; identical
// weights are stored once in host memory (the repository's content-addressed chunks, shared within a tenant). An
// instance serves one request at a time.
//
// Below the API and the remoting hello, an instance is named by its key, "function@instance": the controller places
// it, the data plane holds its residencies, its image and its stream under that name. The instance "" is the
// function itself (a process that names no instance: every such process of the function shares one address space
// and is served one request at a time, as before instances).

// InstanceSeparator joins a function's name and an instance's name in an instance key; CheckName allows it in
// neither.
const InstanceSeparator = "@"

// MaxInstanceLength is the longest instance name: a host name (a Kubernetes pod name, a local replica's id).
const MaxInstanceLength = 63

// CheckInstance reports why instance cannot name an instance: longer than MaxInstanceLength, or made of anything
// but ASCII letters, digits, '-', '_' and '.' (starting with a letter or digit). The empty instance is the function
// itself.
func CheckInstance(instance string) error {
	if len(instance) > MaxInstanceLength {
		return fmt.Errorf("%w: instance is %d bytes long, at most %d", ErrInvalidSpec, len(instance),
			MaxInstanceLength)
	}
	for i, c := range []byte(instance) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_' && c != '.') {
			return fmt.Errorf("%w: instance %q: byte %d (%q) is not allowed (letters, digits, '-', '_', '.'; "+
				"a letter or digit first)", ErrInvalidSpec, instance, i, c)
		}
	}
	return nil
}

// InstanceKey names instance of function below the API: function itself for the instance "".
func InstanceKey(function, instance string) string {
	if instance == "" {
		return function
	}
	return function + InstanceSeparator + instance
}

// SplitInstance is InstanceKey's inverse: the function and the instance of a key ("" for a function's name).
func SplitInstance(key string) (function, instance string) {
	function, instance, _ = strings.Cut(key, InstanceSeparator)
	return function, instance
}

// CheckKey reports why key names no instance: its function part must be a name (CheckName), its instance part an
// instance (CheckInstance).
func CheckKey(key string) error {
	fn, inst := SplitInstance(key)
	if err := CheckName(fn); err != nil {
		return err
	}
	return CheckInstance(inst)
}
