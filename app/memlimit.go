package main

import (
	"errors"
	"log/slog"
	"os"
	"runtime/debug"

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

// applyMemoryLimit sets the catalog's soft memory limit, unless GOMEMLIMIT
// set one: the runtime's own setting wins.
func applyMemoryLimit(limit int, buffers router.ConsumerBuffers, log *slog.Logger) {
	if env, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("memory limit from GOMEMLIMIT", "gomemlimit", env)
		return
	}
	n := memoryLimit(limit, buffers)
	if n < 0 {
		return
	}
	debug.SetMemoryLimit(n)
	log.Info("memory limit", "bytes", n)
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
