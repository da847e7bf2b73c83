package faults

// The previous release, built from the repository's history: release N and
// N−1 run side by side on N's schema, so the upgrade scenarios (build tag
// faults) run N−1's binary beside the one under test. Kept free of that tag
// so that the CHANGELOG's parsing is tested in every go test ./...

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// release is a released version and the commit it was released from.
type release struct {
	version string // semver, e.g. 0.1.0
	commit  string // 40 hex digits
}

func (r release) String() string { return fmt.Sprintf("%s (%.7s)", r.version, r.commit) }

// releaseHeading is a CHANGELOG.md version heading; a released one names its
// commit: "## [0.1.0] - 2026-12-07 (725fe20a…)".
var releaseHeading = regexp.MustCompile(`(?m)^## \[([^\]]+)\] - \S+(?: \(([0-9a-f]{40})\))?[ \t]*$`)

var (
	// errNoPreviousRelease: the changelog names no released version below
	// the current one with its commit.
	errNoPreviousRelease = errors.New("no previous release")
	// errReleaseNotInHistory: the repository lacks the commit a release
	// names, as a shallow clone does.
	errReleaseNotInHistory = errors.New("release commit not in the repository's history")
)

// semver parses MAJOR.MINOR.PATCH.
func semver(v string) ([3]int, error) {
	var out [3]int
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, fmt.Errorf("version %q: want MAJOR.MINOR.PATCH", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, fmt.Errorf("version %q: want MAJOR.MINOR.PATCH", v)
		}
		out[i] = n
	}
	return out, nil
}

// previousRelease is the newest version below current among the changelog's
// headings that name a commit.
func previousRelease(changelog []byte, current string) (release, error) {
	cur, err := semver(current)
	if err != nil {
		return release{}, fmt.Errorf("current version: %w", err)
	}
	var best release
	var bestV [3]int
	for _, m := range releaseHeading.FindAllSubmatch(changelog, -1) {
		if len(m[2]) == 0 {
			continue // unreleased
		}
		v, err := semver(string(m[1]))
		if err != nil {
			return release{}, fmt.Errorf("CHANGELOG.md heading: %w", err)
		}
		if slices.Compare(v[:], cur[:]) < 0 && (best.version == "" || slices.Compare(v[:], bestV[:]) > 0) {
			best, bestV = release{version: string(m[1]), commit: string(m[2])}, v
		}
	}
	if best.version == "" {
		return release{}, fmt.Errorf("%w: CHANGELOG.md has no heading below %s that names its commit", errNoPreviousRelease, current)
	}
	return best, nil
}

// repoPreviousRelease reads VERSION and CHANGELOG.md at the repository's root.
func repoPreviousRelease(root string) (current string, previous release, err error) {
	raw, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", release{}, fmt.Errorf("read VERSION: %w", err)
	}
	current = strings.TrimSpace(string(raw))
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return "", release{}, fmt.Errorf("read CHANGELOG.md: %w", err)
	}
	previous, err = previousRelease(changelog, current)
	return current, previous, err
}

// releaseCache is where built releases are kept: one directory per
// <version>-<commit>.
func releaseCache() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("release cache: %w", err)
	}
	return filepath.Join(home, ".cache", "promoflow", "releases"), nil
}

// buildRelease builds r's promoflow from the repository at root into cache,
// or returns the binary built before. The source is r's commit as git
// archive gives it, so no worktree of the repository is touched.
func buildRelease(ctx context.Context, root, cache string, r release) (string, error) {
	bin := filepath.Join(cache, r.version+"-"+r.commit, "promoflow")
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
		return bin, nil
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", r.commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: release %s names commit %s, which %s does not have (%s); a shallow clone lacks it: run git fetch --unshallow",
			errReleaseNotInHistory, r.version, r.commit, root, bytes.TrimSpace(out))
	}
	src, err := os.MkdirTemp("", "promoflow-release-"+r.version+"-")
	if err != nil {
		return "", fmt.Errorf("build release %s: %w", r, err)
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", r.commit)
	var tarball, stderr bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		return "", fmt.Errorf("git archive %s: %w: %s", r.commit, err, bytes.TrimSpace(stderr.Bytes()))
	}
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		return "", fmt.Errorf("unpack release %s: %w: %s", r, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("build release %s: %w", r, err)
	}
	// Built beside its final name and renamed: a run stopped mid-build
	// leaves no binary that a later run would take as built.
	tmp := bin + ".tmp"
	build := exec.CommandContext(ctx, "go", "build", "-o", tmp, "./app")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build release %s: %w\n%s", r, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("build release %s: %w", r, err)
	}
	return bin, nil
}

// TestPreviousRelease_NewestBelowVersionWithCommit: the previous release is
// the newest version below the current one whose heading names a commit;
// the repository's own VERSION and CHANGELOG.md name one.
func TestPreviousRelease_NewestBelowVersionWithCommit(t *testing.T) {
	const a, b, c = "725fe20a3767e7025fede02b558e027184f4fd99", "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222"
	changelog := []byte("# Changelog\n\n## [0.10.0] - unreleased\n\n### Added\n- x\n\n" +
		"## [0.9.1] - 2027-01-02 (" + c + ")\n\n## [0.9.0] - 2027-01-01 (" + b + ")\n\n" +
		"## [0.2.0] - 2026-12-08\n\n## [0.1.0] - 2026-12-07 (" + a + ")\n")
	for _, tc := range []struct {
		current string
		want    release
	}{
		{"1.0.0", release{"0.9.1", c}},  // 0.10.0 is unreleased
		{"0.10.0", release{"0.9.1", c}}, // numeric, not lexical, order
		{"0.9.1", release{"0.9.0", b}},  // a released current is not its own previous
		{"0.9.0", release{"0.1.0", a}},  // 0.2.0 names no commit
	} {
		if got, err := previousRelease(changelog, tc.current); err != nil || got != tc.want {
			t.Errorf("below %s: got %v, %v; want %v", tc.current, got, err, tc.want)
		}
	}
	if _, err := previousRelease(changelog, "0.1.0"); !errors.Is(err, errNoPreviousRelease) {
		t.Errorf("below 0.1.0: got %v, want errNoPreviousRelease", err)
	}
	if _, err := previousRelease(changelog, "v2"); err == nil {
		t.Error("a current version that is not MAJOR.MINOR.PATCH: no error")
	}
	current, prev, err := repoPreviousRelease("../..")
	if err != nil {
		t.Fatalf("the repository's VERSION and CHANGELOG.md: %v", err)
	}
	if prev.version == current || len(prev.commit) != 40 {
		t.Errorf("the repository's previous release: %v below %s", prev, current)
	}
}

// TestBuildRelease_CommitMissingSaysUnshallow: a release whose commit the
// history lacks is an error naming the commit and git fetch --unshallow,
// never a skip.
func TestBuildRelease_CommitMissingSaysUnshallow(t *testing.T) {
	repo := t.TempDir()
	for _, args := range [][]string{{"init", "-q"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	const missing = "725fe20a3767e7025fede02b558e027184f4fd99"
	_, err := buildRelease(context.Background(), repo, t.TempDir(), release{version: "0.1.0", commit: missing})
	if !errors.Is(err, errReleaseNotInHistory) {
		t.Fatalf("got %v, want errReleaseNotInHistory", err)
	}
	for _, want := range []string{missing, "git fetch --unshallow"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}
