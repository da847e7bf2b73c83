package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRepository_HoldsNoMergeConflictMarkers: no tracked file keeps the
// lines a merge conflict leaves (a document with them still renders, and
// YAML or Markdown tests may not read the part they cover).
func TestRepository_HoldsNoMergeConflictMarkers(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "-C", "..", "ls-files").Output()
	require.NoError(t, err)
	var found []string
	for _, name := range strings.Fields(string(out)) {
		if strings.HasSuffix(name, ".png") {
			continue
		}
		f, err := os.Open(filepath.Join("..", name))
		if err != nil {
			continue // deleted in the work tree
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for n := 1; sc.Scan(); n++ {
			if line := sc.Text(); strings.HasPrefix(line, "<<<<<<< ") || strings.HasPrefix(line, ">>>>>>> ") {
				found = append(found, name+":"+strings.TrimSpace(line))
			}
		}
		f.Close()
	}
	require.Empty(t, found, "merge conflict markers")
}
