package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// settingsDocFile is the settings reference, generated from every command's
// --help by TestSettingsDoc_IsGeneratedFromTheCode.
const settingsDocFile = "../docs/settings.md"

// settingsDocCommands are the commands the reference lists, in its order.
var settingsDocCommands = [][]string{
	{"promotion"}, {"catalog"}, {"dev"}, {"status"}, {"audit"}, {"rebuild"}, {"reconcile"}, {"republish"},
	{"dlq", "replay"}, {"dlq", "park"}, {"outbox", "drain"}, {"outbox", "thaw"}, {"migrate", "up"},
}

// operatorSetting names the settings an operator sets for a deployment (the
// rest tune it): where things are, who may call, what is named how.
var operatorSetting = regexp.MustCompile(`^(DATABASE_|KAFKA_(BROKERS|SASL|TLS)|HTTP_ADDR|ADMIN_ADDR|DEV_CATALOG_HTTP_ADDR|DEV_CATALOG_ADMIN_ADDR|PROMOTION_API_TOKENS|CATALOG_ADMIN_TOKEN|CATALOG_FEED_TOKEN|` +
	`PROMOTION_TOPIC|CATALOG_.*(TOPIC|GROUP)$|LOG_|OTEL_|RELAY_STANDBY_FLUSH|RELAY_TRANSACTIONAL_ID|PROMOFLOW_DEMO)`)

// helpSetting is one setting as --help prints it.
var helpSetting = regexp.MustCompile(`^  (--\S+)\s+(\$\S+|\(flag only\))\s+default (.*)$`)

// TestSettingsDoc_IsGeneratedFromTheCode: docs/settings.md is what every
// command's --help says, grouped into what an operator sets and what tunes
// it. PROMOFLOW_WRITE_SETTINGS_DOC=1 writes it instead of comparing.
func TestSettingsDoc_IsGeneratedFromTheCode(t *testing.T) {
	t.Parallel()
	var doc strings.Builder
	doc.WriteString("# Settings\n\n<!-- Generated from every command's --help by TestSettingsDoc_IsGeneratedFromTheCode (app/settingsdoc_test.go):\n" +
		"     PROMOFLOW_WRITE_SETTINGS_DOC=1 go test -run TestSettingsDoc ./app/ -->\n\n" +
		"Every setting is a flag and an environment variable; a flag wins over its variable. `promoflow <command> --help`\n" +
		"prints the same list. Durations take Go's units (`100ms`, `2s`, `1m30s`, `24h`).\n")
	for _, cmd := range settingsDocCommands {
		c := runCommandToEnd(t, map[string]string{}, 30*time.Second, append(cmd, "--help")...)
		require.Zero(t, c.cmd.ProcessState.ExitCode(), c.output())
		doc.WriteString(settingsSection("promoflow "+strings.Join(cmd, " "), c.stdout.String()))
		require.Equal(t, c.output(), c.stdout.String(), "promoflow %s --help writes to stdout only", strings.Join(cmd, " "))
	}
	if os.Getenv("PROMOFLOW_WRITE_SETTINGS_DOC") == "1" {
		require.NoError(t, os.WriteFile(settingsDocFile, []byte(doc.String()), 0o644))
		return
	}
	have, err := os.ReadFile(settingsDocFile)
	require.NoError(t, err)
	require.Equal(t, doc.String(), string(have),
		"docs/settings.md is not what the commands' --help says: run PROMOFLOW_WRITE_SETTINGS_DOC=1 go test -run TestSettingsDoc ./app/")
}

// settingsSection is one command's part of the reference, from its --help.
func settingsSection(title, help string) string {
	lines := strings.Split(help, "\n")
	var summary []string
	var operator, tuning []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		m := helpSetting.FindStringSubmatch(line)
		if m == nil {
			if i > 0 && line != "" && !strings.HasPrefix(line, "Settings") && !strings.HasPrefix(line, " ") && len(operator)+len(tuning) == 0 {
				summary = append(summary, line)
			}
			continue
		}
		var usage []string
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "      ") {
			i++
			usage = append(usage, strings.TrimSpace(lines[i]))
		}
		env := strings.TrimPrefix(strings.TrimPrefix(m[2], "(flag only)"), "$")
		row := fmt.Sprintf("| `%s` | `%s` | `%s` | %s |", env, m[1], m[3], strings.ReplaceAll(strings.Join(usage, " "), "|", `\|`))
		if env == "" {
			row = fmt.Sprintf("| | `%s` | `%s` | %s |", m[1], m[3], strings.ReplaceAll(strings.Join(usage, " "), "|", `\|`))
		}
		if operatorSetting.MatchString(env) {
			operator = append(operator, row)
		} else {
			tuning = append(tuning, row)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## %s\n\n%s\n", title, strings.Join(summary, " "))
	for _, part := range []struct {
		name string
		rows []string
	}{{"Set by the operator", operator}, {"Tuning", tuning}} {
		if len(part.rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n\n| variable | flag | default | meaning |\n|---|---|---|---|\n%s\n", part.name, strings.Join(part.rows, "\n"))
	}
	return b.String()
}
