package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runMainEnv makes the test binary run promoflow's main with its arguments,
// so that a test starts the real command as a process of its own (its exit
// status, its output) without building another binary.
const runMainEnv = "PROMOFLOW_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"promoflow"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	code := m.Run()
	stopSecureBroker()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// command is a promoflow process started by a test.
type command struct {
	cmd    *exec.Cmd
	out    *lockedBuffer // stdout and stderr
	stdout *lockedBuffer
	done   chan struct{}
}

// settingPrefixes are the environment variables promoflow reads: a command
// gets those of its test only, not the ones the test run has.
var settingPrefixes = []string{"DATABASE_", "KAFKA_", "HTTP_", "PROMOTION_", "CATALOG_", "EXPIRE_", "OUTBOX_",
	"DLQ_", "AUDIT_", "REBUILD_", "STATUS_", "LOG_", "MIGRATE_", "DB_", "IDEMPOTENCY_", "OTEL_", "DEV_", "PROMOFLOW_DEMO", "NO_COLOR",
	"API_", "ADMIN_"}

// startCommand starts `promoflow args...` with env as its settings; the test
// ends it (SIGTERM) when it has not ended by itself.
func startCommand(t *testing.T, env map[string]string, args ...string) *command {
	t.Helper()
	return startProgram(t, os.Args[0], with(env, runMainEnv, "1"), args...)
}

// startProgram starts the program bin (the test binary, or a promoflow
// built by the test) as startCommand does.
func startProgram(t *testing.T, bin string, env map[string]string, args ...string) *command {
	t.Helper()
	env = withInternalListeners(t, env)
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, settingPrefixes) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	c := &command{cmd: cmd, out: &lockedBuffer{}, stdout: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(c.out, c.stdout), c.out
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			t.Logf("output of promoflow %s:\n%s", strings.Join(args, " "), c.output())
		}
	})
	return c
}

// runCommand runs `promoflow args...` to its end, within limit, and returns
// its exit status and its output (stdout and stderr).
func runCommand(t *testing.T, env map[string]string, limit time.Duration, args ...string) (exitCode int, output string) {
	t.Helper()
	c := runCommandToEnd(t, env, limit, args...)
	return c.cmd.ProcessState.ExitCode(), c.output()
}

// runCommandToEnd runs `promoflow args...` to its end, within limit.
func runCommandToEnd(t *testing.T, env map[string]string, limit time.Duration, args ...string) *command {
	t.Helper()
	return runProgramToEnd(t, os.Args[0], with(env, runMainEnv, "1"), limit, args...)
}

// runProgramToEnd runs the program bin to its end, within limit, as
// runCommandToEnd does.
func runProgramToEnd(t *testing.T, bin string, env map[string]string, limit time.Duration, args ...string) *command {
	t.Helper()
	c := startProgram(t, bin, env, args...)
	_, ended := c.wait(limit)
	require.True(t, ended, "promoflow %s still runs after %s; output:\n%s", strings.Join(args, " "), limit, c.output())
	return c
}

// wait waits up to limit for the process to end by itself.
func (c *command) wait(limit time.Duration) (exitCode int, ended bool) {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), true
	case <-time.After(limit):
		return 0, false
	}
}

// exitCode waits for the process to end by itself (at most limit, which only
// stops a hung process from hanging the test) and returns its exit status.
func (c *command) exitCode(t *testing.T, limit time.Duration) int {
	t.Helper()
	code, ended := c.wait(limit)
	require.True(t, ended, "the process still runs after %s; output:\n%s", limit, c.output())
	return code
}

// signal sends sig to the process: SIGSTOP holds it, SIGCONT lets it go on.
func (c *command) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig))
}

// stop sends SIGTERM and waits for the end (SIGKILL after 30s).
func (c *command) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGCONT) // a held process could not stop
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if _, ended := c.wait(30 * time.Second); !ended {
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (c *command) output() string { return c.out.String() }

// waitReady waits until the process at addr answers /readyz with 200.
func (c *command) waitReady(t *testing.T, addr string) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-c.done:
			return true // failed below
		default:
		}
		return readyz(addr) == http.StatusOK
	}, 120*time.Second, 100*time.Millisecond, "not ready at %s; output:\n%s", addr, c)
	select {
	case <-c.done:
		require.FailNow(t, "process ended before it was ready", "exit status %d; output:\n%s", c.cmd.ProcessState.ExitCode(), c.output())
	default:
	}
}

func (c *command) String() string { return c.output() }

// readyz is the status /readyz of the process at addr answers, 0 when none.
func readyz(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// internalAddrs maps a process's public address (HTTP_ADDR) to its internal
// one (ADMIN_ADDR), so that a test reads /metrics and calls /admin by the
// address it started the process on.
var internalAddrs sync.Map

// withInternalListeners gives the process an internal listener of its own
// when env names none (ADMIN_ADDR's default is one fixed port per process
// kind, which tests running at once would share), and records it.
func withInternalListeners(t *testing.T, env map[string]string) map[string]string {
	t.Helper()
	for _, pair := range [][2]string{{"HTTP_ADDR", "ADMIN_ADDR"}, {"DEV_CATALOG_HTTP_ADDR", "DEV_CATALOG_ADMIN_ADDR"}} {
		if _, ok := env[pair[1]]; !ok {
			env = with(env, pair[1], freeAddr(t))
		}
		if public, ok := env[pair[0]]; ok {
			internalAddrs.Store(public, env[pair[1]])
		}
	}
	return env
}

// internalOf is the internal address of the process started on the public
// address addr (addr itself when the test gave no HTTP_ADDR).
func internalOf(addr string) string {
	if internal, ok := internalAddrs.Load(addr); ok {
		return internal.(string)
	}
	return addr
}

// envOf is the settings map of KEY=VALUE lines.
func envOf(lines ...string) map[string]string {
	env := make(map[string]string, len(lines))
	for _, kv := range lines {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// lockedBuffer is a bytes.Buffer that a process writes while a test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
