// Command gen turns the remoting API table (shim/api/cuda.api) into the shim's C encoders and entry points
// (shim/src/calls_gen.{h,c}) and the gpuserver's Go decoders and dispatch (gpuserver/remoting/calls_gen.go).
//
// Run it from the repository root: go run ./shim/gen   (or: make -C shim gen).
// With -check it writes nothing and fails if a generated file is out of date.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "fail if a generated file is out of date instead of writing it")
	entries := flag.String("entries", "", "print the entry lines of the CUDA include directory given (cuda.h, "+
		"cudaTypedefs.h) instead of generating: the starting point of a new CUDA version's table")
	flag.Parse()
	if *entries != "" {
		h, err := ReadHeader(*entries)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		fmt.Print(h.EntryLines())
		return
	}
	if err := run(*root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// outputs renders every generated file, keyed by path relative to the repository root.
func outputs(root string) (map[string][]byte, error) {
	f, err := os.Open(filepath.Join(root, "shim/api/cuda.api"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	api, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("shim/api/cuda.api: %w", err)
	}
	hdr, src := GenC(api)
	g, err := GenGo(api)
	if err != nil {
		return nil, fmt.Errorf("format Go: %w", err)
	}
	return map[string][]byte{
		"shim/src/calls_gen.h":            hdr,
		"shim/src/calls_gen.c":            src,
		"shim/src/aliases_gen.opts":       GenAliases(api),
		"gpuserver/remoting/calls_gen.go": g,
	}, nil
}

func run(root string, check bool) error {
	outs, err := outputs(root)
	if err != nil {
		return err
	}
	for path, want := range outs {
		full := filepath.Join(root, path)
		if check {
			got, err := os.ReadFile(full)
			if err != nil || !bytes.Equal(got, want) {
				return fmt.Errorf("%s is out of date: run go run ./shim/gen", path)
			}
			continue
		}
		if err := os.WriteFile(full, want, 0o644); err != nil {
			return err
		}
	}
	return nil
}
