package rebuild_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// A rebuild process that the kill test starts: the test binary itself, run
// with these variables, rebuilds and holds at the point named until killed.
const (
	killAtEnv    = "PROMOFLOW_TEST_REBUILD_HOLD_AT"
	killDBEnv    = "PROMOFLOW_TEST_REBUILD_DATABASE_URL"
	killTopicEnv = "PROMOFLOW_TEST_REBUILD_TOPIC"
	// heldLine is what the process prints once it holds at its point.
	heldLine = "rebuild held at "
)

// Short lease settings, so that the next rebuild takes over a killed one soon.
const (
	killStatusEvery = 100 * time.Millisecond
	killStaleAfter  = time.Second
)

// TestRebuild_KilledAtAnyPhaseLeavesTheLiveProjection kills (SIGKILL) a
// rebuild process at each of its points in turn, from before it records the
// ends to inside its switch's transaction: every time the live projection
// (cards, replica, dedup marks) is exactly as it was, the status reports the
// rebuild failed once its lease is stale, and the next rebuild drops what the
// killed one left and ends equal to the model of the events.
func TestRebuild_KilledAtAnyPhaseLeavesTheLiveProjection(t *testing.T) {
	if at := os.Getenv(killAtEnv); at != "" {
		holdUntilKilled(t, rebuild.Point(at))
		return
	}
	b := setup(t)
	projects, objects := cards(t, b)
	b.Start(t)
	h := &history{}
	produceHistory(t, b, h, projects, objects, 12)
	cfg := rebuild.Config{StatusEvery: killStatusEvery, StaleAfter: killStaleAfter}

	for _, at := range []rebuild.Point{rebuild.PointBeforeEnds, rebuild.PointEnds, rebuild.PointRead, rebuild.PointLoad,
		rebuild.PointCompute, rebuild.PointCatchUp, rebuild.PointSwitchLocked, rebuild.PointSwitch} {
		corrupt(t, b, h)
		before, err := readView(t.Context(), b, false)
		require.NoError(t, err)
		marks := dedupMarks(t, b)

		killAt(t, b.URL, b.Cfg.Topic, at)

		requireView(t, b, before, fmt.Sprintf("killed at %s", at))
		require.ElementsMatch(t, marks, dedupMarks(t, b), "killed at %s: the dedup marks", at)
		require.NotEmpty(t, buildTables(t, b), "killed at %s: the rebuild's tables are left for the next one to drop", at)
		rb := newRebuilderWith(t, b, cfg)
		require.Eventually(t, func() bool {
			st, err := rb.Status(t.Context())
			return err == nil && st.State == rebuild.StateFailed
		}, 30*time.Second, 20*time.Millisecond, "killed at %s: the status reports the rebuild failed once stale", at)

		st, err := rb.Run(context.Background())
		require.NoError(t, err, "the rebuild after one killed at %s", at)
		require.Equal(t, rebuild.StateDone, st.State)
		requireModel(t, b, h, fmt.Sprintf("the rebuild after one killed at %s", at))
		requireNoBuildTables(t, b)
	}
}

// killAt starts a rebuild process on the database at url and topic, waits
// until it holds at point at, and kills it with SIGKILL.
func killAt(t *testing.T, url, topic string, at rebuild.Point) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), killAtEnv+"="+string(at), killDBEnv+"="+url, killTopicEnv+"="+topic)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	held := make(chan bool, 1)
	go func() {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			if lines.Text() == heldLine+string(at) {
				held <- true
				break
			}
		}
		held <- false
		for lines.Scan() { // drain, so that the process never blocks on its output
		}
	}()
	select {
	case ok := <-held:
		require.True(t, ok, "the rebuild process ended before it held at %s", at)
	case <-time.After(time.Minute):
		t.Errorf("the rebuild process did not hold at %s within a minute", at)
	}
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait() // killed: an error, by design
}

// holdUntilKilled is the rebuild process of killAt: it rebuilds, and at point
// at prints heldLine and holds, its connections and transaction open, until
// it is killed.
func holdUntilKilled(t *testing.T, at rebuild.Point) {
	db := pgtest.Open(t, os.Getenv(killDBEnv))
	rb, err := rebuild.New(rebuild.Config{DB: db, Kafka: kafkatest.Cluster(t), Topic: os.Getenv(killTopicEnv),
		StatusEvery: killStatusEvery, StaleAfter: killStaleAfter, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rb.SetHook(func(ctx context.Context, p rebuild.Point) error {
		if p == at {
			fmt.Println(heldLine + string(p))
			<-ctx.Done() // never, short of a lost lease: the process is killed here
			return ctx.Err()
		}
		return nil
	})
	_, err = rb.Run(context.Background())
	t.Fatalf("the rebuild was to be killed at %s, and it ended: %v", at, err)
}
