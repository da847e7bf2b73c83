//go:build faults

package faults

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one promoflow process of a scenario. It keeps its address across
// restarts, so Prometheus sees one instance that went down and came back.
type proc struct {
	name string // e.g. promotion-1
	job  string // promotion or catalog
	addr string
	args []string
	bin  string
	logs string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newProc(t *testing.T, s *suite, job string, n int, args []string) *proc {
	p := &proc{name: fmt.Sprintf("%s-%d", job, n), job: job, addr: freeAddr(t), bin: s.bin}
	p.args = append([]string{job, "--http-addr", p.addr}, args...)
	// Each process names its PostgreSQL sessions, so a scenario can see
	// which one is inside a transaction.
	for i, a := range p.args {
		if a == "--database-url" && i+1 < len(p.args) {
			p.args[i+1] += "&application_name=" + p.name
		}
	}
	p.logs = filepath.Join(s.work, fmt.Sprintf("%s-%s.log", t.Name(), p.name))
	_ = os.MkdirAll(filepath.Dir(p.logs), 0o755)
	return p
}

// start runs the process and waits until it answers /healthz.
func (p *proc) start(t *testing.T) {
	t.Helper()
	out, err := os.OpenFile(p.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		if !p.alive() || time.Now().After(deadline) {
			t.Fatalf("%s did not come up (log %s)", p.name, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill is kill -9.
func (p *proc) kill() { p.signal(syscall.SIGKILL) }

// stop is a graceful stop (SIGTERM), waiting up to 60s.
func (p *proc) stop() { p.signal(syscall.SIGTERM) }

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || !p.alive() {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// ready is /readyz's status code, or 0 when the process does not answer.
func (p *proc) ready() int {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
