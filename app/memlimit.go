package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/promoflow/promoflow/router"
)

// memoryLimitBase is the catalog's soft memory limit less its buffers: the
// runtime, the Kafka client and its codecs' buffers (lz4 keeps 4 MiB blocks
// pooled), the database pool, metrics, and the headroom the collector needs
// to run at a sane pace.
const memoryLimitBase = 60 << 20

// memoryLimit is the soft memory limit (bytes) the catalog runs with: limit
// when positive, none when negative, and when 0 memoryLimitBase plus the
// read-ahead and one fetch response, the budgets a backlog fills. The
// collector keeps the heap's slack, twice the live heap by default, under
// it; without it a catalog catching up at 48 partitions peaked at 105-125 MB
// for compressed batches, with it at 89-93 MB, at the same rate
// (docs/runbooks/catalog-promotion-boost.md, "Memory").
func memoryLimit(limit int, buffers router.ConsumerBuffers) int64 {
	switch {
	case limit < 0:
		return -1
	case limit > 0:
		return int64(limit)
	}
	buffers = buffers.WithDefaults()
	return memoryLimitBase + int64(buffers.ReadAheadBytes) + int64(buffers.FetchResponseBytes)
}

// cgroupMemoryFiles hold the container's memory limit: cgroup v2's, then
// cgroup v1's. A test points them at fixtures.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// cgroupShare is the part of the container's memory limit the heap may
// reach: the rest is for the runtime's own memory, goroutine stacks and what
// the collector has yet to return, so that the kernel's OOM killer is not the
// first to act.
const cgroupShare = 0.9

// cgroupUnlimited is where cgroup v1 reports no limit: it writes the largest
// page-aligned int64 (9223372036854771712), not "max".
const cgroupUnlimited = 1 << 62

// cgroupMemoryLimit is the memory limit (bytes) of the cgroup this process
// runs in, from the first of files that exists; 0 when none does or it
// sets no limit ("max" on v2, a near-MaxInt64 value on v1).
func cgroupMemoryLimit(files []string) (limit int64, file string, err error) {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, f, fmt.Errorf("read cgroup memory limit: %w", err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, f, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, f, fmt.Errorf("cgroup memory limit %s: %q is neither bytes nor \"max\"", f, s)
		}
		if n >= cgroupUnlimited {
			return 0, f, nil
		}
		return n, f, nil
	}
	return 0, "", nil
}

// applyMemoryLimit sets a long-running process's soft memory limit, read
// once at start, and returns what to log of it (memoryLimit, in bytes or
// "none", and memoryLimitSource). GOMEMLIMIT, when set, wins: the runtime
// read it already. Then own when not 0 (the catalog's CATALOG_MEMORY_LIMIT
// and its buffers; negative: none). Then 90% of the container's cgroup
// memory limit, so that the collector works harder before the kernel kills
// the process; none when the cgroup sets no limit, or (with a warning on
// log) when its file cannot be read.
func applyMemoryLimit(own int64, log *slog.Logger) []any {
	chosen := func(limit any, source string, more ...any) []any {
		return append([]any{"memoryLimit", limit, "memoryLimitSource", source}, more...)
	}
	if env, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return chosen(env, "GOMEMLIMIT")
	}
	switch {
	case own < 0:
		return chosen("none", "setting")
	case own > 0:
		debug.SetMemoryLimit(own)
		return chosen(own, "setting")
	}
	cgroup, file, err := cgroupMemoryLimit(cgroupMemoryFiles)
	if err != nil {
		log.Warn("the container's memory limit is unreadable: none is set; set GOMEMLIMIT", "file", file, "error", err.Error())
		return chosen("none", "cgroup")
	}
	if cgroup == 0 {
		return chosen("none", "cgroup")
	}
	n := int64(float64(cgroup) * cgroupShare)
	debug.SetMemoryLimit(n)
	return chosen(n, "cgroup", "cgroupMemoryLimit", cgroup, "cgroupFile", file)
}

func validateMemoryLimit(limit int) error {
	if limit > 0 && limit < minMemoryLimit {
		return errors.New("catalog memory limit must be at least 32 MiB (0: from the buffers, -1: none)")
	}
	return nil
}

// minMemoryLimit is the least limit taken: below it the collector would
// run without pause.
const minMemoryLimit = 32 << 20
