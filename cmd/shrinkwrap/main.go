// Command shrinkwrap lays out ./build/<name>/ for every function of stack.yml the way
// `faas-cli build --shrinkwrap` does (template files at the top, the handler in function/).
//
//	go run ./cmd/shrinkwrap [-f stack.yml] [-templates template] [-out build]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

func main() {
	stack := flag.String("f", "stack.yml", "stack file")
	templates := flag.String("templates", "template", "folder of templates (<folder>/<lang>/), faas-cli's ./template")
	out := flag.String("out", "build", "folder to write <out>/<function>/ into")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "shrinkwrap: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	built, err := shrinkwrap.Build(*stack, *templates, *out)
	for _, b := range built {
		fmt.Println("shrinkwrap: wrote", b)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shrinkwrap:", err)
		os.Exit(1)
	}
}
