package handlers

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Proxied requests and their streams end with their server.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
