package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// ServerOptions shape a private PostgreSQL server.
type ServerOptions struct {
	// Settings are extra server settings, e.g. {"max_connections": "20"}.
	Settings map[string]string
	// TLS turns ssl on, with a certificate for 127.0.0.1 and localhost
	// signed by a CA of the test's own (Server.CA).
	TLS bool
	// HBA replaces pg_hba.conf, one rule a line, e.g.
	// "hostssl all all 127.0.0.1/32 trust". Defaults to trust on 127.0.0.1
	// for every connection, with or without TLS.
	HBA []string
}

// Server is a PostgreSQL server of the test's own, initdb'd in a temp folder
// and listening on a free 127.0.0.1 port; it is stopped and removed at cleanup.
// Its superuser is postgres, trusted without a password.
type Server struct {
	Host string
	Port int
	// Dir holds data/, the server log and the socket.
	Dir string
	// CA signed the server's certificate when ServerOptions.TLS was set.
	CA *CA

	owner                 serviceUser
	bindir, data, logFile string
	conninfo              string            // a standby's primary_conninfo (StartStandby)
	settings              map[string]string // what it was started with
}

// URL is the server's postgres database URL with the given query, e.g.
// "sslmode=disable".
func (s *Server) URL(query string) string {
	return fmt.Sprintf("postgres://postgres@%s:%d/postgres?%s", s.Host, s.Port, query)
}

// SocketDSN reaches the server over its unix socket, where the default HBA
// (and any that keeps "local all all trust") lets postgres in without a password.
func (s *Server) SocketDSN() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", s.Dir, s.Port)
}

// StartServer initdb's and starts a private PostgreSQL server from the
// installed binaries (scripts/stack.sh installs them). As root, it runs as
// the postgres user, which PostgreSQL requires.
func StartServer(t testing.TB, opts ServerOptions) *Server {
	t.Helper()
	bindir := serverBindir(t)
	dir, err := os.MkdirTemp("", "pgtest-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	owner := ownFolder(t, dir)
	data := filepath.Join(dir, "data")
	if out, err := owner.command(dir, filepath.Join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C.UTF-8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	s := &Server{Host: "127.0.0.1", Dir: dir, owner: owner, bindir: bindir, data: data}
	settings := map[string]string{"listen_addresses": s.Host, "unix_socket_directories": dir,
		"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
	if opts.TLS {
		s.CA = NewCA(t, "pgtest CA")
		cert, key := s.CA.Issue(t, "127.0.0.1", "localhost")
		owner.writeFile(t, filepath.Join(data, "server.crt"), cert)
		owner.writeFile(t, filepath.Join(data, "server.key"), key)
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = "server.crt"
		settings["ssl_key_file"] = "server.key"
	}
	hba := opts.HBA
	if hba == nil {
		hba = []string{"local all all trust", "host all all 127.0.0.1/32 trust",
			"local replication all trust", "host replication all 127.0.0.1/32 trust"}
	}
	owner.writeFile(t, filepath.Join(data, "pg_hba.conf"), []byte(strings.Join(hba, "\n")+"\n"))
	for k, v := range opts.Settings {
		settings[k] = v
	}

	s.logFile = filepath.Join(dir, "postgresql.log")
	s.start(t, settings)
	return s
}

// start starts the server on a free port with settings (its port added), and
// stops it at cleanup.
func (s *Server) start(t testing.TB, settings map[string]string) {
	t.Helper()
	s.settings = settings
	var lastErr error
	for range 3 { // a free port can be taken between picking and binding it
		s.Port = FreePort(t)
		settings["port"] = strconv.Itoa(s.Port)
		out, err := s.owner.command(s.Dir, filepath.Join(s.bindir, "pg_ctl"), "-D", s.data, "-w", "-t", "60", "-l", s.logFile,
			"-o", serverOptions(settings), "start").CombinedOutput()
		if err == nil {
			t.Cleanup(func() {
				_ = s.owner.command(s.Dir, filepath.Join(s.bindir, "pg_ctl"), "-D", s.data, "-m", "immediate", "-w", "stop").Run()
			})
			return
		}
		log, _ := os.ReadFile(s.logFile)
		lastErr = fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Fatal(lastErr)
}

// Crash stops the server as a crash would (an immediate shutdown: no
// checkpoint, every backend killed, its clients' connections cut) and starts
// it again, on the same port with the same settings: it runs crash recovery,
// which empties every unlogged table. It returns once the server accepts
// connections.
func (s *Server) Crash(t testing.TB) {
	t.Helper()
	out, err := s.owner.command(s.Dir, filepath.Join(s.bindir, "pg_ctl"), "-D", s.data, "-m", "immediate", "-w", "-t", "60",
		"-l", s.logFile, "restart").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(s.logFile)
		t.Fatalf("pg_ctl restart -m immediate: %v\n%s\n%s", err, out, log)
	}
}

// serverOptions are settings as postgres command-line options, values quoted.
func serverOptions(settings map[string]string) string {
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " -c %s='%s'", k, strings.ReplaceAll(settings[k], "'", `\'`))
	}
	return b.String()
}

// serverBindir finds initdb and pg_ctl: pg_config's bindir, else the newest
// version under /usr/lib/postgresql (as scripts/stack.sh does).
func serverBindir(t testing.TB) string {
	t.Helper()
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); fileExists(filepath.Join(d, "initdb")) {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) < versionOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if fileExists(filepath.Join(dirs[i], "initdb")) {
			return dirs[i]
		}
	}
	t.Fatal("no PostgreSQL server binaries (initdb): run the tests with scripts/test.sh, which installs them")
	return ""
}

func versionOf(bindir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return v
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// FreePort is a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// serviceUser runs a server's commands: the postgres user when the test runs
// as root (PostgreSQL and PgBouncer refuse to run as root), the test's own
// user otherwise.
type serviceUser struct {
	cred *syscall.Credential // nil: the test's own user
}

// ownFolder gives dir to the service user.
func ownFolder(t testing.TB, dir string) serviceUser {
	t.Helper()
	if os.Geteuid() != 0 {
		return serviceUser{}
	}
	u, err := user.Lookup("postgres")
	require.NoError(t, err, "the postgres user (Debian's postgresql package creates it)")
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	require.NoError(t, os.Chown(dir, uid, gid))
	require.NoError(t, os.Chmod(dir, 0o700))
	return serviceUser{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
}

// command runs name as the service user, in dir (a folder it can read:
// initdb and pg_ctl fail in one it cannot).
func (u serviceUser) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if u.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: u.cred}
	}
	return cmd
}

// writeFile writes a file only the service user may read (server keys must be).
func (u serviceUser) writeFile(t testing.TB, path string, body []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, body, 0o600))
	if u.cred != nil {
		require.NoError(t, os.Chown(path, int(u.cred.Uid), int(u.cred.Gid)))
	}
}
