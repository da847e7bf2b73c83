package router_test

import (
	"bufio"
	"cmp"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// metricsPoll is how often BenchmarkCatalogCatchUp reads the process's
// /metrics: each read gathers the Go and process collectors too, about a
// millisecond of the process's CPU, which faster reads would add to its CPU
// per event.
const metricsPoll = 250 * time.Millisecond

// catchUpPartitions is the purchase topic's partitions in BenchmarkCatalogCatchUp:
// the default of a topic the processes create.
const catchUpPartitions = 48

// BenchmarkCatalogCatchUp measures a real `promoflow catalog` process, the
// binary built from ./app, catching up a backlog. The events of a workload are
// on a compacted topic of 48 partitions before the process starts with its
// default settings (and any CATALOG_*, GOGC or GOMEMLIMIT of the benchmark's
// environment), and it runs until its group's lag is 0. It reports the
// events/s from the first event the process handled to the last; its peak
// RSS (VmHWM, the kernel's high-water mark of the process's resident memory
// over its whole life, read once the lag is 0); and, over the same span as the
// events/s, the CPU time per event of the process and of the database's
// PostgreSQL backends, and their total; and the mean events of its
// group-commit transactions (events/tx). 100,000 events of each workload,
// 5,000 under -short, or PROMOFLOW_CATCHUP_EVENTS.
//
// The producer is a dimension (catchUpShapes): the cascade workload's topic
// is filled as the relay writes it and by franz-go with record batches of up
// to 16 KiB, 256 KiB and 1 MiB, uncompressed and snappy, lz4 and zstd; the
// simple workload's as the relay writes it. Each reports the shape of the
// batches a consumer reads (records and KiB a batch, the largest batch).
//
// PROMOFLOW_CATCHUP_VERSUS, a list of settings (for example Sarama's own
// buffer sizes, "CATALOG_FETCH_PARTITION_BYTES=1048576 ..."), makes each of
// the b.N rounds two pairs of runs: one side with the defaults, one with those
// settings, each on a topic and database of its own, the defaults first in
// the first pair and second in the second, so that a drift of the machine
// weighs on both alike. It reports the other side's figures beside the
// defaults' and the median of the pairs' ratios of events/s (on a shared
// machine one run moves by tens of percent either way).
// PROMOFLOW_CATCHUP_VERSUS_BIN, a binary built elsewhere (another version),
// makes the other side of each pair run it, with the settings of
// PROMOFLOW_CATCHUP_VERSUS if any, so that two versions are compared in one run.
func BenchmarkCatalogCatchUp(b *testing.B) {
	bin := buildPromoflow(b)
	n := benchEvents(b, "PROMOFLOW_CATCHUP_EVENTS", 100_000, 5_000)
	versus := strings.Fields(os.Getenv("PROMOFLOW_CATCHUP_VERSUS"))
	for _, kv := range versus {
		require.Contains(b, kv, "=", "PROMOFLOW_CATCHUP_VERSUS: %q is not NAME=value", kv)
	}
	versusBin := cmp.Or(os.Getenv("PROMOFLOW_CATCHUP_VERSUS_BIN"), bin)
	compare := len(versus) > 0 || versusBin != bin
	runs := []struct {
		w     workload
		shape producerShape
	}{{simple, relayShape}}
	for _, shape := range catchUpShapes() {
		runs = append(runs, struct {
			w     workload
			shape producerShape
		}{cascade, shape})
	}
	for _, r := range runs {
		b.Run("workload="+r.w.name+"/producer="+r.shape.name, func(b *testing.B) {
			var defaults, other catchUpSide
			var ratios []float64
			pairs := 0
			if !compare {
				for range b.N {
					defaults.run(b, bin, n, r.w, r.shape, nil)
				}
			} else {
				pairs = 2 * b.N
			}
			for i := range pairs {
				var mine, theirs float64
				inTurn(i, func() { mine = defaults.run(b, bin, n, r.w, r.shape, nil) },
					func() { theirs = other.run(b, versusBin, n, r.w, r.shape, versus) })
				ratios = append(ratios, mine/theirs)
			}
			defaults.report(b, "")
			if compare {
				other.report(b, "versus-")
				b.ReportMetric(median(ratios), "median-pair-defaults/versus")
				b.Logf("each pair's events/s, defaults/versus (%s %s), in order: %.3f", versusBin, strings.Join(versus, " "), ratios)
			}
			b.Logf("%d events (%s, producer %s: %s) on %d partitions; %s", n, r.w.name, r.shape.name, defaults.shape,
				catchUpPartitions, loadAverage())
		})
	}
}

// catchUpSide is one side of BenchmarkCatalogCatchUp's runs: the sum of
// their events/s, CPU times and group-commit transactions, the highest peak
// RSS and the topic's batch shape.
type catchUpSide struct {
	tp     throughput
	cpu    cpuPerEvent
	txs    transactions
	peakMB float64
	shape  batchShape
}

// transactions sums the events and the transactions of the catalog's group
// commits (its catalog_promotion_batch_size histogram).
type transactions struct{ events, count float64 }

func (t transactions) perTx() float64 { return t.events / t.count }

// addSizes adds transactions of the given sizes (events each).
func (t *transactions) addSizes(sizes []int) {
	for _, n := range sizes {
		t.events += float64(n)
	}
	t.count += float64(len(sizes))
}

// run catches up once with env added to the process's environment and
// returns that run's events/s.
func (s *catchUpSide) run(b *testing.B, bin string, n int, w workload, producer producerShape, env []string) float64 {
	var tp throughput
	mb, shape := catchUp(b, bin, n, w, producer, env, &tp, &s.cpu, &s.txs)
	s.tp.add(tp.events, tp.secs)
	s.peakMB, s.shape = max(s.peakMB, mb), shape
	return tp.rate()
}

// report adds the side's figures, their names led by prefix.
func (s *catchUpSide) report(b *testing.B, prefix string) {
	b.ReportMetric(s.tp.rate(), prefix+"events/s")
	b.ReportMetric(s.peakMB, prefix+"peak-rss-MB")
	b.ReportMetric(s.txs.perTx(), prefix+"events/tx")
	s.cpu.reportAs(b, prefix, "catalog")
	if prefix == "" {
		s.shape.report(b)
	}
}

// buildPromoflow builds the promoflow binary into the benchmark's temp
// folder, or returns PROMOFLOW_CATCHUP_BIN, a binary built elsewhere (another
// version, to compare).
func buildPromoflow(b *testing.B) string {
	if bin := os.Getenv("PROMOFLOW_CATCHUP_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(b.TempDir(), "promoflow")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/promoflow/promoflow/app").CombinedOutput()
	require.NoError(b, err, "go build: %s", out)
	return bin
}

// catchUp puts n events of w on a topic in the producer's shape, runs
// `promoflow catalog` (env added to its environment) until its lag is 0, adds its events/s, CPU time and
// group-commit transactions to tp, cpu and txs, and returns its peak RSS in MiB and the topic's batch shape.
func catchUp(b *testing.B, bin string, n int, w workload, producer producerShape, env []string, tp *throughput, cpu *cpuPerEvent,
	txs *transactions) (peakMB float64, shape batchShape) {
	cb := newWorkloadBench(b, 4, n, w)
	topic := kafkatest.TopicWith(b, kafkakit.Topic{Partitions: catchUpPartitions, CleanupPolicy: kafkakit.PolicyCompact})
	producer.produce(b, cb, topic)
	shape = topicBatchShape(b, topic, n)

	pg := watchPGBackends(b, cb.c.DB)
	p := startCatalogProcess(b, bin, cb.c, topic, env)
	require.Eventually(b, func() bool { return p.consumed(b) > 0 }, 2*time.Minute, metricsPoll, "the catalog took no event")
	first, start := p.consumed(b), time.Now()
	cpuAt, pgAt := p.cpu(b), pg.CPU()
	require.Eventually(b, func() bool { return p.consumed(b) >= n }, 15*time.Minute, metricsPoll, "the catalog did not consume every event")
	secs := time.Since(start).Seconds()
	catalogCPU := p.cpu(b) - cpuAt
	pg.close()
	cpu.add(n-first, catalogCPU, pg.CPU()-pgAt, pg != nil)
	tp.add(n-first, secs)

	waitLagZero(b, cb.c.Cfg.ConsumerGroup, topic)
	txs.events += p.metric(b, "catalog_promotion_batch_size_sum ")
	txs.count += p.metric(b, "catalog_promotion_batch_size_count ")
	peakMB = p.peakRSSMB(b)
	p.stop(b)
	return peakMB, shape
}

// produceAll publishes the bench's messages to topic, keyed by PurchaseId,
// 500 in one request as the relay sends them (handlers/outbox), so that
// each partition's record batches are about 10 records, as on a topic the
// relay wrote.
func produceAll(b *testing.B, cb *consumerBench, topic string) {
	marshaler := kafka.NewWithPartitioningMarshaler(event.PartitionKey)
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(b), kafkatest.Cluster(b).DurableProducerConfig("promoflow-bench"))
	require.NoError(b, err)
	defer producer.Close()
	for i := 0; i < len(cb.msgs); i += 500 {
		var records []*sarama.ProducerMessage
		for _, msg := range cb.msgs[i:min(i+500, len(cb.msgs))] {
			r, err := marshaler.Marshal(topic, msg)
			require.NoError(b, err)
			records = append(records, r)
		}
		require.NoError(b, producer.SendMessages(records))
	}
}

// catalogProcess is a running `promoflow catalog`.
type catalogProcess struct {
	cmd   *exec.Cmd
	addr  string
	admin string // the internal listener: /metrics
	log   string
	done  chan struct{}
}

// startCatalogProcess starts bin as the catalog of bundle c on topic, with
// env after the benchmark's own CATALOG_*, GOGC and GOMEMLIMIT (so that env's
// win), and its log in a file; the benchmark's end stops it.
func startCatalogProcess(b *testing.B, bin string, c *catalogtest.Bundle, topic string, env []string) *catalogProcess {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	addr := ln.Addr().String()
	require.NoError(b, ln.Close())
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	admin := ln.Addr().String()
	require.NoError(b, ln.Close())

	p := &catalogProcess{cmd: exec.Command(bin, "catalog"), addr: addr, admin: admin, log: filepath.Join(b.TempDir(), "catalog.log"),
		done: make(chan struct{})}
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CATALOG_") || strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Env = append(p.cmd.Env, "DATABASE_URL="+c.URL, "KAFKA_BROKERS="+strings.Join(c.Cfg.Kafka.Brokers, ","),
		"KAFKA_CREATE_TOPICS=false", "PROMOTION_TOPIC="+topic, "CATALOG_REPLAY_TOPIC="+c.Cfg.ReplayTopic,
		"CATALOG_DLQ_TOPIC="+c.Cfg.DLQTopic, "CATALOG_CONSUMER_GROUP="+c.Cfg.ConsumerGroup, "HTTP_ADDR="+addr, "ADMIN_ADDR="+p.admin)
	out, err := os.Create(p.log)
	require.NoError(b, err)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	require.NoError(b, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); out.Close(); close(p.done) }()
	b.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// consumed is the process's catalog_promotion_consumed_total over every
// outcome (0 until it answers).
func (p *catalogProcess) consumed(b *testing.B) int {
	return int(p.metric(b, "catalog_promotion_consumed_total{"))
}

// metric sums the samples of the process's /metrics whose line starts with
// prefix (0 until it answers).
func (p *catalogProcess) metric(b *testing.B, prefix string) float64 {
	p.alive(b)
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum float64
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), prefix); ok {
			v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
			require.NoError(b, err)
			sum += v
		}
	}
	return sum
}

// alive fails the benchmark, with the process's log, when it ended.
func (p *catalogProcess) alive(b *testing.B) {
	select {
	case <-p.done:
		raw, _ := os.ReadFile(p.log)
		b.Fatalf("promoflow catalog ended: %s\n%s", p.cmd.ProcessState, tail(string(raw), 4000))
	default:
	}
}

// cpu is the process's CPU time so far.
func (p *catalogProcess) cpu(b *testing.B) time.Duration {
	cpu, ok := procCPU(p.cmd.Process.Pid)
	require.True(b, ok, "no /proc entry of the catalog process")
	return cpu
}

// peakRSSMB is the process's VmHWM in MiB.
func (p *catalogProcess) peakRSSMB(b *testing.B) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(b, err)
	return vmHWMMB(b, string(raw))
}

// stop ends the process with SIGTERM and requires a clean exit.
func (p *catalogProcess) stop(b *testing.B) {
	require.NoError(b, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		b.Fatal("promoflow catalog did not stop within a minute of SIGTERM")
	}
	raw, _ := os.ReadFile(p.log)
	require.True(b, p.cmd.ProcessState.Success(), "promoflow catalog: %s\n%s", p.cmd.ProcessState, tail(string(raw), 4000))
}

// waitLagZero waits until group has committed the end of every partition of topic.
func waitLagZero(b testing.TB, group, topic string) {
	b.Helper()
	ends := catalogtest.PartitionSizes(b, topic)
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(b), kafkatest.Cluster(b).ClientConfig("promoflow-bench"))
	require.NoError(b, err)
	defer admin.Close()
	parts := make([]int32, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	lag := int64(-1)
	require.Eventually(b, func() bool {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			return false
		}
		lag = 0
		for p, end := range ends {
			block := resp.GetBlock(topic, p)
			if block == nil || block.Offset < 0 {
				lag += end
				continue
			}
			lag += end - block.Offset
		}
		return lag == 0
	}, time.Minute, 50*time.Millisecond, "group %s still lags %d records behind", group, lag)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
