package ui_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The pool page samples the pool on a goroutine of its own: it ends when the page is closed.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
