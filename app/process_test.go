package main

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// asProcessEnv makes this test binary run as promoflow (TestMain), so that a
// test can watch a real process: its exit status and everything it prints.
const asProcessEnv = "PROMOFLOW_TEST_AS_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(asProcessEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// process is a promoflow process started by a test.
type process struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error // of Wait, once done is closed
}

// startProcess runs `promoflow args...` with env added to the test's
// environment; it is stopped (SIGTERM) at cleanup if still running.
func startProcess(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), asProcessEnv+"=1"), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a held process could not stop
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
		if t.Failed() {
			t.Logf("output of promoflow %v:\n%s", args, p.out.String())
		}
	})
	return p
}

// signal sends sig to the process: SIGSTOP holds it, SIGCONT lets it go on.
func (p *process) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// exitCode waits for the process to end (at most timeout, which only stops a
// hung process from hanging the test) and returns its exit status.
func (p *process) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("the process still runs after %s; output:\n%s", timeout, p.out.String())
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(t, p.err)
	return 0
}

// waitReady waits until the process at addr answers /readyz with 200, and
// fails at once when the process ends first.
func (p *process) waitReady(t *testing.T, addr string) {
	t.Helper()
	ended := false
	require.Eventually(t, func() bool {
		select {
		case <-p.done:
			ended = true
			return true
		default:
		}
		return readyz(addr) == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond)
	require.False(t, ended, "the process ended before it was ready; output:\n%s", p.out.String())
}

// lockedBuffer collects a process's output while the test reads it.
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

// readyz is the status /readyz of the process at addr answers, 0 when none.
func readyz(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
