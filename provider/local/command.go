package local

import (
	"regexp"
	"strings"
)

// pythonName matches the bare names a template's fprocess uses for its interpreter: python, python3, python3.11.
var pythonName = regexp.MustCompile(`^python([0-9]+(\.[0-9]+)?)?$`)

// command returns the argv a replica of rec runs: the function's envProcess (what faas-cli deploy sends: the
// template's fprocess, "python3 index.py" for gpu-python), else Config.Python with index.py. A bare Python
// interpreter name at the start of envProcess names the template's language, not a binary of this machine, so it is
// replaced by Config.Python: `python index.py` runs on a machine with only python3, and --python picks the
// interpreter for every function. A path (/usr/bin/python3.12) is kept as given.
func (b *Backend) command(rec record) []string {
	argv := strings.Fields(rec.Deployment.EnvProcess)
	if len(argv) == 0 {
		return []string{b.cfg.Python, "index.py"}
	}
	if pythonName.MatchString(argv[0]) {
		argv[0] = b.cfg.Python
	}
	return argv
}
