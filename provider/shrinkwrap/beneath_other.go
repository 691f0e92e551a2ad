//go:build !linux

package shrinkwrap

import "os"

// openBeneath opens rel inside the folder top (whose path is root), following links only while they stay beneath
// it (the portable check: this kernel has no openat2).
func openBeneath(top *os.File, rel, root string) (*os.File, error) {
	return openBeneathPortable(top, rel, root)
}
