// Package validate checks a function deployment (POST and PUT /system/functions) for values that can never work:
// environment variables a process cannot be started with (a NUL byte, a name with '=', a value beyond the kernel's
// limit on one environment string), control characters in an image or command, and sizes beyond sane limits. The
// provider refuses such a deployment with 400 and a message naming the field, instead of accepting it and
// crash-looping. Backend-specific rules (Kubernetes label syntax, GPU annotations) are checked elsewhere.
package validate

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// Limits on a deployment. MaxEnvEntry is Linux's MAX_ARG_STRLEN (32 pages) less the terminating NUL: execve refuses
// a longer NAME=value string with E2BIG.
const (
	MaxImage       = 4096
	MaxEnvProcess  = 4096
	MaxEnvVars     = 512
	MaxEnvName     = 256
	MaxEnvEntry    = 32*4096 - 1
	MaxEnvTotal    = 256 << 10
	MaxMetaEntries = 256
	MaxMetaKey     = 317 // a Kubernetes label/annotation key: 253-byte prefix, '/', 63-byte name
	MaxMetaTotal   = 256 << 10
	MaxSecrets     = 64
	MaxConstraints = 64
	MaxConstraint  = 1024
	MaxResource    = 64
)

// envName is the character set Kubernetes allows in environment variable names (C identifiers plus '-' and '.').
var envName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// Deployment checks every field of fd against the limits above. Errors wrap provider.ErrInvalid and name the field.
func Deployment(fd types.FunctionDeployment) error {
	if err := names.Function("service", fd.Service); err != nil {
		return err
	}
	if err := text("image", fd.Image, MaxImage); err != nil {
		return err
	}
	if strings.ContainsFunc(fd.Image, unicode.IsSpace) {
		return invalid("image %q must not contain white space", clip(fd.Image))
	}
	if err := text("envProcess", fd.EnvProcess, MaxEnvProcess); err != nil {
		return err
	}
	if fd.EnvProcess != "" && strings.TrimSpace(fd.EnvProcess) == "" {
		return invalid("envProcess is only white space; leave it out to run the template's entrypoint")
	}
	if err := envVars(fd.EnvVars); err != nil {
		return err
	}
	if err := meta("labels", fd.Labels); err != nil {
		return err
	}
	if err := meta("annotations", fd.Annotations); err != nil {
		return err
	}
	if len(fd.Secrets) > MaxSecrets {
		return invalid("secrets: %d secrets, at most %d", len(fd.Secrets), MaxSecrets)
	}
	for _, s := range fd.Secrets {
		if err := names.Secret("secrets", s); err != nil {
			return err
		}
	}
	if len(fd.Constraints) > MaxConstraints {
		return invalid("constraints: %d constraints, at most %d", len(fd.Constraints), MaxConstraints)
	}
	for i, c := range fd.Constraints {
		if err := text(fmt.Sprintf("constraints[%d]", i), c, MaxConstraint); err != nil {
			return err
		}
	}
	if err := Resources(fd); err != nil { // resources.go
		return err
	}
	return nil
}

// envVars checks environment variables the way execve and Kubernetes will see them.
func envVars(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return invalid("envVars: %d variables, at most %d", len(env), MaxEnvVars)
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		switch {
		case k == "":
			return invalid("envVars: a variable has an empty name")
		case strings.ContainsRune(k, '='):
			return invalid("envVars[%q]: a variable name must not contain '='", clip(k))
		case strings.ContainsRune(k, 0):
			return invalid("envVars[%q]: a variable name must not contain a NUL byte", clip(k))
		case len(k) > MaxEnvName:
			return invalid("envVars[%q]: the name is %d bytes, at most %d", clip(k), len(k), MaxEnvName)
		case !envName.MatchString(k):
			return invalid("envVars[%q]: a variable name has letters, digits, '_', '-' and '.', and does not "+
				"start with a digit", clip(k))
		case strings.ContainsRune(v, 0):
			return invalid("envVars[%q]: the value must not contain a NUL byte", k)
		case len(k)+1+len(v) > MaxEnvEntry:
			return invalid("envVars[%q]: the value is %d bytes; a process cannot be started with an environment "+
				"string over %d bytes", k, len(v), MaxEnvEntry)
		}
		total += len(k) + 1 + len(v) + 1
	}
	if total > MaxEnvTotal {
		return invalid("envVars: %d bytes in all, at most %d (use a secret for large values)", total, MaxEnvTotal)
	}
	return nil
}

// meta checks labels or annotations.
func meta(field string, m *map[string]string) error {
	if m == nil {
		return nil
	}
	if len(*m) > MaxMetaEntries {
		return invalid("%s: %d entries, at most %d", field, len(*m), MaxMetaEntries)
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(*m)) {
		v := (*m)[k]
		if k == "" {
			return invalid("%s: an entry has an empty key", field)
		}
		if err := text(fmt.Sprintf("%s key %q", field, clip(k)), k, MaxMetaKey); err != nil {
			return err
		}
		if strings.ContainsRune(v, 0) {
			return invalid("%s[%q]: the value must not contain a NUL byte", field, k)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetaTotal {
		return invalid("%s: %d bytes in all, at most %d", field, total, MaxMetaTotal)
	}
	return nil
}

// text checks a single-line value: at most max bytes and no control characters but tabs.
func text(field, v string, max int) error {
	if len(v) > max {
		return invalid("%s is %d bytes, at most %d", field, len(v), max)
	}
	for _, r := range v {
		if r == '\t' {
			continue
		}
		if r == 0 {
			return invalid("%s must not contain a NUL byte", field)
		}
		if unicode.IsControl(r) {
			return invalid("%s must not contain control characters (found %U)", field, r)
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", provider.ErrInvalid, fmt.Sprintf(format, args...))
}

// clip shortens a value quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
