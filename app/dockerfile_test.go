package main

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The image's recipe and what its build context leaves out.
const (
	dockerfile   = "../deploy/Dockerfile"
	dockerignore = "../.dockerignore"
)

// imageDigest is an image reference pinned to one manifest.
var imageDigest = regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)

// TestDockerfile_EveryBaseImageIsPinnedByDigest: every FROM names its image
// by digest (image:tag@sha256:...), or a stage built before it, so that a
// tag moved on a registry changes nothing that ships.
func TestDockerfile_EveryBaseImageIsPinnedByDigest(t *testing.T) {
	f, err := os.Open(dockerfile)
	require.NoError(t, err)
	defer f.Close()
	var stages []string
	scanner := bufio.NewScanner(f)
	for line := 1; scanner.Scan(); line++ {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 0 || !strings.EqualFold(fields[0], "FROM") {
			continue
		}
		fields = slices.DeleteFunc(fields[1:], func(s string) bool { return strings.HasPrefix(s, "--") }) // --platform=...
		require.NotEmpty(t, fields, "%s:%d: FROM names no image", dockerfile, line)
		image := fields[0]
		if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
			stages = append(stages, fields[2])
		}
		if slices.Contains(stages[:max(len(stages)-1, 0)], image) {
			continue // an earlier stage
		}
		require.Regexp(t, imageDigest, image,
			"%s:%d: FROM %s is not pinned: write image:tag@sha256:<digest> (the Dockerfile's head says how to find it)", dockerfile, line, image)
	}
	require.NoError(t, scanner.Err())
	require.NotEmpty(t, stages, "the Dockerfile has no build stage")
}

// TestDockerignore_KeepsGitLocalStateAndTestDataOutOfTheImage: the build
// context leaves out the repository's history, local binaries and caches,
// and test data; what the build needs stays in.
func TestDockerignore_KeepsGitLocalStateAndTestDataOutOfTheImage(t *testing.T) {
	raw, err := os.ReadFile(dockerignore)
	require.NoError(t, err, "the build context needs a .dockerignore")
	var patterns []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	for _, want := range []string{".git", "bin", ".cache", "**/testdata", "**/*_test.go", "**/.env"} {
		require.Contains(t, patterns, want, ".dockerignore must leave %s out of the build context", want)
	}
	for _, needed := range []string{"app", "go.mod", "go.sum", "sqlmigrate", "router", "handlers", "middleware", "VERSION"} {
		require.NotContains(t, patterns, needed, "the build needs %s", needed)
	}
}
