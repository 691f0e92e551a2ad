package shrinkwrap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// languageTemplate is every field faas-cli 0.18.12 reads from ./template/<lang>/template.yml (go-sdk's
// stack.LanguageTemplate); the layout test decodes strictly, so a misspelt or unknown field fails.
type languageTemplate struct {
	Language     string `json:"language"`
	FProcess     string `json:"fprocess"`
	BuildOptions []struct {
		Name     string   `json:"name"`
		Packages []string `json:"packages"`
	} `json:"build_options,omitempty"`
	WelcomeMessage string `json:"welcome_message"`
	HandlerFolder  string `json:"handler_folder,omitempty"`
	MountSSH       bool   `json:"mount_ssh,omitempty"`
}

// TestTemplateLayoutMatchesFaasCLI pins the layout faas-cli reads templates from, so that `faas-cli new --lang
// gpu-python`, `faas-cli deploy -f stack.yml` and `faas-cli build --shrinkwrap` work in the repository and
// `faas-cli template pull <this repository>` finds the template:
//
//   - faas-cli reads ./template/<lang>/template.yml (commands/deploy.go deriveFprocess, commands/new_function.go);
//   - `template pull` copies every folder under the repository's template/ (commands/fetch_templates.go);
//   - `new` copies ./template/<lang>/<handler_folder or function>/ into the new function's folder.
func TestTemplateLayoutMatchesFaasCLI(t *testing.T) {
	root := filepath.Join(repo, "template")
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatalf("faas-cli reads templates from ./template/: %v", err)
	}
	if _, err := os.Stat(filepath.Join(repo, "templates")); err == nil {
		t.Error("a ./templates/ folder exists beside ./template/: faas-cli reads only ./template/")
	}
	langs := map[string]languageTemplate{}
	for _, e := range entries {
		if !e.IsDir() {
			t.Errorf("template/%s: only template folders belong in template/ (template pull copies folders)", e.Name())
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, e.Name(), "template.yml"))
		if err != nil {
			t.Errorf("template/%s: %v", e.Name(), err)
			continue
		}
		var lt languageTemplate
		if err := yaml.UnmarshalStrict(raw, &lt); err != nil {
			t.Errorf("template/%s/template.yml: %v", e.Name(), err)
			continue
		}
		if lt.Language != e.Name() {
			t.Errorf("template/%s/template.yml: language %q, want the folder's name", e.Name(), lt.Language)
		}
		handler := lt.HandlerFolder
		if handler == "" {
			handler = "function"
		}
		if st, err := os.Stat(filepath.Join(root, e.Name(), handler)); err != nil || !st.IsDir() {
			t.Errorf("template/%s: faas-cli new copies %s/ into the new function: %v", e.Name(), handler, err)
		}
		// faas-cli deploy sends fprocess as the function's envProcess; it must run where only python3 exists.
		argv := strings.Fields(lt.FProcess)
		if len(argv) != 2 || argv[0] != "python3" || argv[1] != "index.py" {
			t.Errorf("template/%s/template.yml: fprocess %q, want \"python3 index.py\"", e.Name(), lt.FProcess)
		}
		langs[e.Name()] = lt
	}
	s, err := ReadStack(filepath.Join(repo, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range s.Names() {
		if _, ok := langs[s.Functions[name].Lang]; !ok {
			t.Errorf("stack.yml: function %s uses lang %q, which ./template/ lacks", name, s.Functions[name].Lang)
		}
	}
}
