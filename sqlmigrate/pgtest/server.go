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
	"testing"

	"github.com/stretchr/testify/require"
)

// Server starts a PostgreSQL server of the test's own, with the given server
// settings (such as "max_connections=20"), and returns the URL of its
// postgres database; the server is stopped and its files removed at cleanup.
// It is for tests of the server's own limits, which a shared server cannot
// be set to. The binaries are those scripts/stack.sh uses (pg_config's, else
// the newest under /usr/lib/postgresql); as root the server runs as the
// postgres user, as scripts/stack.sh runs it.
func Server(t testing.TB, settings ...string) string {
	t.Helper()
	bin := serverBinaries(t)
	dir, err := os.MkdirTemp("", "pgtest-server-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	owner := serverOwner(t, dir)
	data := filepath.Join(dir, "data")
	run(t, owner, filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8")

	port := freePort(t)
	opts := []string{"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
	for _, s := range settings {
		opts = append(opts, "-c", s)
	}
	run(t, owner, filepath.Join(bin, "pg_ctl"), "-D", data, "-w", "-t", "60", "-l", filepath.Join(dir, "postgresql.log"),
		"-o", strings.Join(opts, " "), "start")
	t.Cleanup(func() {
		cmd := command(owner, filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("stop the test's PostgreSQL: %v\n%s", err, out)
		}
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// serverBinaries is the folder of initdb and pg_ctl.
func serverBinaries(t testing.TB) string {
	t.Helper()
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); fileExists(filepath.Join(d, "initdb")) {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if fileExists(filepath.Join(dirs[i], "initdb")) {
			return dirs[i]
		}
	}
	t.Fatal("no PostgreSQL server binaries (initdb): install Debian's postgresql, as scripts/stack.sh does")
	return ""
}

func version(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// serverOwner is the user the server runs as: the postgres user when the
// test runs as root (PostgreSQL refuses root), who then owns dir; "" for the
// test's own user.
func serverOwner(t testing.TB, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		return ""
	}
	u, err := user.Lookup("postgres")
	require.NoError(t, err, "running as root, PostgreSQL needs the postgres user")
	uid, err := strconv.Atoi(u.Uid)
	require.NoError(t, err)
	gid, err := strconv.Atoi(u.Gid)
	require.NoError(t, err)
	require.NoError(t, os.Chown(dir, uid, gid))
	return u.Username
}

func command(owner, name string, args ...string) *exec.Cmd {
	if owner == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("runuser", append([]string{"-u", owner, "--", name}, args...)...)
}

func run(t testing.TB, owner, name string, args ...string) {
	t.Helper()
	out, err := command(owner, name, args...).CombinedOutput()
	require.NoError(t, err, "%s: %s", filepath.Base(name), out)
}

// freePort is a TCP port of 127.0.0.1 that nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
