//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is one promoflow process of a scenario. It keeps its address across
// restarts, so Prometheus sees one instance that went down and came back.
//
// It records every exit with its status and whether the harness caused it
// (kill, stop); an exit nobody caused is reported to unexpected. It also
// knows when it is deliberately down: from the moment the harness kills,
// stops or freezes it until it answers again after a start (or is thawed),
// the only time a dropped connection to it is accepted.
type proc struct {
	name string // e.g. promotion-1
	job  string // promotion or catalog
	addr string
	// internal is the process's internal listener (ADMIN_ADDR): /metrics
	// and /admin, which the public addr does not serve.
	internal string
	args     []string
	bin      string
	// previous marks a process of the previous release (asPrevious).
	previous bool
	// env is added to the suite's environment.
	env  []string
	logs string
	// unexpected is told of an exit the harness did not cause, or of a
	// graceful stop that did not exit 0.
	unexpected func(p *proc, x exitRecord)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// cause is what the harness did to end the process: "", "kill" or "stop".
	cause string
	// down is true while the process is deliberately down; downs counts
	// the times it went down deliberately.
	down  bool
	downs int
	exits []exitRecord
}

// exitRecord is one exit of a process.
type exitRecord struct {
	state string // as os.ProcessState says it: "exit status 2", "signal: killed"
	code  int    // -1 when a signal ended the process
	cause string // what the harness did, "" for nothing
	at    time.Time
}

func (x exitRecord) String() string {
	cause := x.cause
	if cause == "" {
		cause = "nobody asked"
	}
	return fmt.Sprintf("%s at %s (%s)", x.state, x.at.Format("15:04:05.000"), cause)
}

// asPrevious makes p a process of the previous release, bin: that release
// has no internal listener and no feed token, so p serves /metrics and
// /admin on its public address and takes the admin token for the feed.
func (p *proc) asPrevious(bin string) {
	p.bin, p.previous, p.internal = bin, true, p.addr
	var args []string
	for i := 0; i < len(p.args); i++ {
		if p.args[i] == "--admin-addr" || p.args[i] == "--feed-token" {
			i++ // and its value
			continue
		}
		args = append(args, p.args[i])
	}
	p.args = args
}

// newProc makes the process named job-n; args gives its arguments by name.
func newProc(t *testing.T, s *suite, job string, n int, args func(name string) []string) *proc {
	p := &proc{name: fmt.Sprintf("%s-%d", job, n), job: job, addr: freeAddr(t), internal: freeAddr(t), bin: s.bin}
	p.args = append([]string{job, "--http-addr", p.addr, "--admin-addr", p.internal}, args(p.name)...)
	// Each process names its PostgreSQL sessions, so a scenario can see
	// which one is inside a transaction.
	for i, a := range p.args {
		if a == "--database-url" && i+1 < len(p.args) {
			sep := " " // a keyword DSN's
			if strings.Contains(p.args[i+1], "://") {
				sep = "&"
			}
			p.args[i+1] += sep + "application_name=" + p.name
		}
	}
	p.logs = filepath.Join(s.work, fmt.Sprintf("%s-%s.log", t.Name(), p.name))
	_ = os.MkdirAll(filepath.Dir(p.logs), 0o755)
	return p
}

// migrateUp applies the migrations of the release bin to the scenario's
// database with `promoflow migrate up`, as an operator does before a
// release's processes start: they do not migrate (MIGRATE_ON_START is false).
func migrateUp(t *testing.T, bin, dbURL string) {
	t.Helper()
	out, err := exec.Command(bin, "migrate", "up", "--database-url", dbURL).CombinedOutput()
	if err != nil {
		t.Fatalf("promoflow migrate up: %v\n%s", err, out)
	}
}

// start runs the process and waits until it answers /healthz; that ends a
// deliberate down.
func (p *proc) start(t *testing.T) {
	t.Helper()
	out, err := os.OpenFile(p.logs, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), p.env...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.cause = cmd, done, ""
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		out.Close()
		p.exited(cmd.ProcessState)
		close(done)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			p.mu.Lock()
			p.down = false
			p.mu.Unlock()
			return
		}
		if !p.alive() || time.Now().After(deadline) {
			t.Fatalf("%s did not come up (log %s)", p.name, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) exited(st *os.ProcessState) {
	p.mu.Lock()
	x := exitRecord{state: st.String(), code: st.ExitCode(), cause: p.cause, at: time.Now()}
	p.exits = append(p.exits, x)
	p.mu.Unlock()
	if (x.cause == "" || (x.cause == "stop" && x.code != 0)) && p.unexpected != nil {
		p.unexpected(p, x)
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

// window says whether the process is deliberately down now, and how many
// times it went down so far: a request that saw either change was sent into
// a deliberate down.
func (p *proc) window() (down bool, downs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down, p.downs
}

// goDown marks the start of a deliberate down, and what will end the process.
func (p *proc) goDown(cause string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		p.down = true
		p.downs++
	}
	if cause != "" {
		p.cause = cause
	}
}

// kill is kill -9.
func (p *proc) kill() { p.signal("kill", syscall.SIGKILL) }

// stop is a graceful stop (SIGTERM), waiting up to 60s; the process must exit 0.
func (p *proc) stop() { p.signal("stop", syscall.SIGTERM) }

// freeze stops the process with SIGSTOP: it holds whatever it holds (an
// open transaction, an unacked message) and cannot commit it. A frozen
// process is deliberately down until it is thawed or killed.
func (p *proc) freeze() {
	p.goDown("")
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
}

// thaw resumes a frozen process, which ends its deliberate down.
func (p *proc) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	p.down = false
}

func (p *proc) signal(cause string, sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || !p.alive() {
		return
	}
	p.goDown(cause)
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

// crashLine matches what a Go runtime crash, or a recovered panic that a
// process logs, writes.
var crashLine = regexp.MustCompile(`(?i)panic|fatal error`)

// crashes are the lines of the process's log (every run of it) that tell of
// a panic or a fatal error.
func (p *proc) crashes() ([]string, error) {
	var out []string
	err := p.scanLog(crashLine, func(n int, line string) {
		out = append(out, fmt.Sprintf("%s:%d: %.300s", p.logs, n, line))
	})
	return out, err
}

// count is how many lines of the process's log match re.
func (p *proc) count(re *regexp.Regexp) (int, error) {
	n := 0
	err := p.scanLog(re, func(int, string) { n++ })
	return n, err
}

// scanLog calls match with the number and text of each line of the
// process's log that re matches.
func (p *proc) scanLog(re *regexp.Regexp, match func(n int, line string)) error {
	f, err := os.Open(p.logs)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		if re.Match(sc.Bytes()) {
			match(n, sc.Text())
		}
	}
	return sc.Err()
}

// exitLog is every exit so far.
func (p *proc) exitLog() []exitRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exitRecord(nil), p.exits...)
}
