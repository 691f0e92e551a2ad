package api_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The API serves connections and holds leases on goroutines of its own: none may outlive its server.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
