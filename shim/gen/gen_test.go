package main

import (
	"strings"
	"testing"
)

// TestGeneratedFilesUpToDate fails when the API table and the checked-in generated code disagree.
func TestGeneratedFilesUpToDate(t *testing.T) {
	if err := run("../..", true); err != nil {
		t.Fatal(err)
	}
}

func TestParseRejectsBadTables(t *testing.T) {
	for name, table := range map[string]string{
		"duplicate id":      "sync 1 a()\nsync 1 b()\n",
		"duplicate name":    "sync 1 a()\nsync 2 a()\n",
		"async out":         "async 1 a(out u64 x)\n",
		"bad type":          "sync 1 a(float x)\n",
		"bad length":        "sync 1 a(in bytes[n] x)\n",
		"length not scalar": "sync 1 a(in bytes[y] x, in str y)\n",
		"unknown flag":      "sync 1 a() fast\n",
	} {
		if _, err := Parse(strings.NewReader(table)); err == nil {
			t.Errorf("%s: parsed without error", name)
		} else if !strings.Contains(err.Error(), "line") {
			t.Errorf("%s: error %q does not name the line", name, err)
		}
	}
}
