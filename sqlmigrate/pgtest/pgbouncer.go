package pgtest

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// PgBouncerOptions shape a test's PgBouncer.
type PgBouncerOptions struct {
	// Upstream is the PostgreSQL URL PgBouncer connects to, e.g. a
	// DatabaseURL; its host, port, user and password serve every database.
	Upstream string
	// PoolSize is the server connections per database and user. Defaults to
	// 5: far fewer than the clients, so that transactions share them.
	PoolSize int
}

// PgBouncer is Debian's pgbouncer (scripts/test.sh installs it) in transaction
// pooling, of the test's own, on a free 127.0.0.1 port. It is stopped at cleanup.
type PgBouncer struct {
	Port     int
	dir      string
	owner    serviceUser
	upstream *url.URL
	cmd      *exec.Cmd
	done     chan struct{}
}

// StartPgBouncer starts a PgBouncer in transaction pooling in front of opts.Upstream.
func StartPgBouncer(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	bin := pgbouncerBin(t)
	up, err := url.Parse(opts.Upstream)
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &PgBouncer{Port: FreePort(t), dir: dir, owner: ownFolder(t, dir), upstream: up}
	user := cmp.Or(up.User.Username(), "postgres")
	password := ""
	if p, ok := up.User.Password(); ok {
		password = " password='" + strings.ReplaceAll(p, "'", `\'`) + "'"
	}
	// The server side logs in as the upstream's user; clients are trusted.
	b.owner.writeFile(t, filepath.Join(dir, "users.txt"), fmt.Appendf(nil, "%q %q\n", user, ""))
	b.owner.writeFile(t, filepath.Join(dir, "pgbouncer.ini"), fmt.Appendf(nil, `[databases]
* = host=%s port=%s user=%s%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = %s
`, up.Hostname(), cmp.Or(up.Port(), "5432"), user, password, b.Port, filepath.Join(dir, "users.txt"),
		cmp.Or(opts.PoolSize, 5), filepath.Join(dir, "pgbouncer.log")))
	b.start(t, bin)
	t.Cleanup(func() { b.Stop(t) })
	return b
}

// URL is the upstream URL with PgBouncer in place of the server.
func (b *PgBouncer) URL() string {
	u := *b.upstream
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	return u.String()
}

// Stop shuts PgBouncer down at once (SIGTERM): every client and server
// connection is cut, transactions in flight too. Stopping a stopped one does nothing.
func (b *PgBouncer) Stop(t testing.TB) {
	t.Helper()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	<-b.done
	b.cmd = nil
}

// Start starts a stopped PgBouncer again on its port.
func (b *PgBouncer) Start(t testing.TB) {
	t.Helper()
	b.start(t, pgbouncerBin(t))
}

// pgbouncerBin is the pgbouncer binary: on PATH, or where Debian puts it.
func pgbouncerBin(t testing.TB) string {
	t.Helper()
	if bin, err := exec.LookPath("pgbouncer"); err == nil {
		return bin
	}
	if fileExists("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer"
	}
	t.Fatal("pgbouncer is not installed: run the tests with scripts/test.sh, which installs Debian's pgbouncer")
	return ""
}

func (b *PgBouncer) start(t testing.TB, bin string) {
	t.Helper()
	b.cmd = b.owner.command(b.dir, bin, filepath.Join(b.dir, "pgbouncer.ini"))
	require.NoError(t, b.cmd.Start())
	b.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(b.cmd, b.done)
	exited := false
	require.Eventually(t, func() bool {
		select {
		case <-b.done:
			exited = true
			return true
		default:
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)), time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}, 30*time.Second, 20*time.Millisecond, "pgbouncer listens on %d", b.Port)
	if exited {
		log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
		t.Fatalf("pgbouncer exited at start:\n%s", log)
	}
}
