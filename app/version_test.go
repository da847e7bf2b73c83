package main

import (
	"bufio"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// releaseFile is the release the repository's VERSION file names.
func releaseFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../VERSION")
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// TestVersion_MatchesTheVersionFile: the binary's Version and the Helm
// chart's version and appVersion are what the repository's VERSION file
// says, so a release bumps one and the test catches the others.
func TestVersion_MatchesTheVersionFile(t *testing.T) {
	release := releaseFile(t)
	require.Equal(t, release, Version, "app.Version differs from the VERSION file: change both")
	requireChartIsTheRelease(t, release)
}

// TestVersion_EverySurfaceReportsTheBuild: a promoflow built from this
// checkout with Go's VCS stamp names the same release, commit and Go version
// in `promoflow version` (and --version, -version), in a promotion process's
// start-up log record and its promoflow_build_info, and in `promoflow status`
// (its screen and --json); the Helm chart deploys that release.
func TestVersion_EverySurfaceReportsTheBuild(t *testing.T) {
	t.Parallel()
	bin := buildStamped(t)
	want := stampOf(t, bin)
	require.Equal(t, releaseFile(t), want.Version)

	line := fmt.Sprintf("promoflow %s (commit %s) %s", want.Version, want.Revision[:12], want.GoVersion)
	if want.Modified {
		line = fmt.Sprintf("promoflow %s (commit %s, modified) %s", want.Version, want.Revision[:12], want.GoVersion)
	}
	for _, arg := range []string{"version", "--version", "-version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		require.NoError(t, err, "promoflow %s: %s", arg, out)
		require.Equal(t, line+"\n", string(out), "promoflow %s prints the build's one line", arg)
	}

	url := migratedDatabaseURL(t)
	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	env := envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","), "PROMOTION_TOPIC="+topic,
		"KAFKA_TOPIC_PARTITIONS=1", "LOG_FORMAT=json")
	addr := freeAddr(t)
	proc := startProgram(t, bin, with(env, "HTTP_ADDR", addr), "promotion")
	proc.waitReady(t, addr)

	started := startRecord(t, proc.output())
	require.NotNil(t, started, "promotion logs no start-up record (msg \"starting\"); output:\n%s", proc.output())
	require.Equal(t, want.Version, started["version"], "the start-up record's version")
	require.Equal(t, want.Revision, started["revision"], "the start-up record's revision")
	require.Equal(t, want.Modified, started["modified"], "the start-up record's modified")
	require.Equal(t, want.GoVersion, started["goVersion"], "the start-up record's goVersion")

	series := fmt.Sprintf(`promoflow_build_info{go_version=%q,revision=%q,version=%q}`, want.GoVersion, want.Revision, want.Version)
	require.Equal(t, 1.0, metricValue(t, addr, series), "promotion's /metrics has %s 1", series)

	status := runProgramToEnd(t, bin, env, time.Minute, "status", "--json")
	var rep struct {
		Build *build `json:"build"`
	}
	require.NoError(t, json.Unmarshal([]byte(status.stdout.String()), &rep), "promoflow status --json prints JSON; output:\n%s", status.output())
	require.NotNil(t, rep.Build, "promoflow status --json has no build; output:\n%s", status.stdout.String())
	require.Equal(t, want, *rep.Build, "promoflow status --json's build")
	screen := runProgramToEnd(t, bin, env, time.Minute, "status").stdout.String()
	require.Contains(t, screen, "\n  read by "+line+"\n", "promoflow status names the build that read it")

	requireChartIsTheRelease(t, want.Version)
}

// startRecord is the first JSON log record whose msg is "starting", or nil.
func startRecord(t *testing.T, output string) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(output))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "starting" {
			return rec
		}
	}
	return nil
}

// stampOf is the build that Go stamped into bin, read without running it:
// what every surface of bin must report.
func stampOf(t *testing.T, bin string) build {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	b := buildOf(info)
	head, err := exec.Command("git", "-C", "..", "rev-parse", "HEAD").Output()
	require.NoError(t, err, "git rev-parse HEAD: the test needs a git checkout")
	require.Equal(t, strings.TrimSpace(string(head)), b.Revision, "the built binary's VCS stamp names this checkout's HEAD")
	return b
}

// buildStamped builds promoflow with Go's VCS stamp and returns its path.
// Go stamps only a checkout whose .git is a directory; a linked worktree's
// .git is a file, so there it builds a copy of the checkout's files (tracked
// and untracked, not ignored) whose .git links to the worktree's git
// directory. GIT_OPTIONAL_LOCKS=0 keeps the git status that go build runs
// from rewriting that directory's index.
//
// It builds once per test run (built); the tests that need a binary of their
// own, not the test binary (which the race detector may instrument), share it.
func buildStamped(t *testing.T) string {
	t.Helper()
	built.once.Do(func() { built.bin, built.err = buildStampedOnce(t) })
	require.NoError(t, built.err)
	return built.bin
}

// built is the one promoflow binary the tests build (buildStamped); TestMain
// removes its directory.
var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func buildStampedOnce(t *testing.T) (string, error) {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	src := root
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		src = copyCheckout(t, root)
	}
	if built.dir, err = os.MkdirTemp("", "promoflow-bin-"); err != nil {
		return "", err
	}
	bin := filepath.Join(built.dir, "promoflow")
	cmd := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./app")
	cmd.Dir, cmd.Env = src, append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -buildvcs=true: %w: %s", err, out)
	}
	return bin, nil
}

// copyCheckout copies the files of the checkout at root that git sees into a
// new directory, whose .git is a link to the checkout's git directory.
func copyCheckout(t *testing.T, root string) string {
	t.Helper()
	gitDir, err := exec.Command("git", "-C", root, "rev-parse", "--absolute-git-dir").Output()
	require.NoError(t, err, "git rev-parse --absolute-git-dir: the test needs a git checkout")
	files, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	require.NoError(t, err)
	dst := t.TempDir()
	for _, name := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		from, to := filepath.Join(root, name), filepath.Join(dst, name)
		fi, err := os.Lstat(from)
		if os.IsNotExist(err) {
			continue // deleted, not yet committed
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(from)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(target, to))
			continue
		}
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, b, fi.Mode().Perm()))
	}
	require.NoError(t, os.Symlink(strings.TrimSpace(string(gitDir)), filepath.Join(dst, ".git")))
	return dst
}
