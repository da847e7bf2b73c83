package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/promoflow/promoflow/"

// mayImport is docs/architecture.md's "who may import whom": for each
// package, the promoflow packages (a trailing "/" takes every package below)
// its code may import. A package not listed here fails the test: add it with
// its rule.
var mayImport = map[string][]string{
	"handlers/event":                 nil,
	"handlers/retention":             nil,
	"handlers/logtest":               nil,
	"handlers/tlstest":               nil,
	"handlers/nettest":               nil,
	"handlers/dberr":                 nil,
	"handlers/outbox":                {"handlers/event", "handlers/dberr"},
	"handlers/boost":                 {"handlers/event"},
	"handlers/purchase":              {"handlers/event", "handlers/outbox", "handlers/retention", "handlers/dberr"},
	"handlers/expire":                {"handlers/event", "handlers/outbox", "handlers/purchase", "handlers/dberr"},
	"handlers/purchase/purchasetest": {"handlers/"},
	"sqlmigrate":                     nil,
	"sqlmigrate/pgtest":              {"sqlmigrate", "handlers/tlstest"},
	"middleware":                     {"handlers/dberr", "handlers/event", "handlers/retention", "middleware/otlpexport"},
	"middleware/otlpexport":          nil,
	"router/kafkakit":                nil,
	"router/kafkakit/kafkatest":      {"router/kafkakit", "handlers/tlstest"},
	"router/bounded":                 {"router/kafkakit"},
	"router/rebuild":                 {"handlers/", "middleware", "router/bounded", "router/kafkakit", "sqlmigrate"},
	"router/dlqreplay":               {"handlers/", "middleware", "router/bounded", "router/kafkakit"},
	"router/audit":                   {"handlers/", "middleware", "router/bounded", "router/kafkakit"},
	"router/reconcile":               {"handlers/", "router/bounded", "router/kafkakit"},
	"router/status":                  {"handlers/", "middleware", "router/bounded", "router/dlqreplay", "router/kafkakit", "router/rebuild"},
	"router":                         {"handlers/", "middleware", "middleware/otlpexport", "router/audit", "router/bounded", "router/dlqreplay", "router/kafkakit", "router/rebuild", "router/reconcile", "router/status"},
	"router/catalogtest":             {"handlers/", "middleware", "router", "router/bounded", "router/kafkakit", "router/kafkakit/kafkatest", "sqlmigrate/pgtest"},
	"app/api":                        {"handlers/", "router/bounded", "router/rebuild"},
	"app/demo":                       {"handlers/event"},
	"app":                            {"app/api", "app/demo", "handlers/", "middleware", "middleware/otlpexport", "router", "router/", "sqlmigrate"},
	"scripts/benchplot":              nil,
	// The fault suite's checker (its scenarios build with the faults tag,
	// which go list leaves out) reads the purchase topic as the operator tools do.
	"scripts/faults": {"handlers/event", "router/bounded", "router/kafkakit"},
}

// testHelpers may be imported by any package's tests: they sit below every
// layer (real PostgreSQL and Kafka for tests, captured logs, seeded purchases).
var testHelpers = []string{"sqlmigrate/pgtest", "router/kafkakit", "router/kafkakit/kafkatest", "handlers/logtest", "handlers/tlstest",
	"handlers/nettest", "handlers/purchase/purchasetest", "handlers/event"}

// forbiddenInHandlers keeps the business rules free of Kafka, HTTP and flags.
var forbiddenInHandlers = []string{"github.com/IBM/sarama", "github.com/ThreeDotsLabs/watermill-kafka", "net/http", "flag"}

func allowed(rules []string, imp string) bool {
	for _, r := range rules {
		if imp == r || (strings.HasSuffix(r, "/") && strings.HasPrefix(imp, r)) {
			return true
		}
	}
	return false
}

// TestArchitecture_PackagesImportOnlyWhatTheirLayerMay reads every package,
// and its tests, from go list -deps -test and checks each promoflow import
// against mayImport: lower layers never import upper ones, not even in tests.
func TestArchitecture_PackagesImportOnlyWhatTheirLayerMay(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}", module+"...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	require.NoError(t, err)
	var violations []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imports, _ := strings.Cut(line, "|")
		if !strings.HasPrefix(path, module) || strings.HasSuffix(path, ".test") {
			continue
		}
		// "pkg [pkg.test]" is pkg with its internal tests, "pkg_test [pkg.test]" its external ones.
		name, variant, isTest := strings.Cut(strings.TrimPrefix(path, module), " ")
		isTest = isTest && variant != ""
		name = strings.TrimSuffix(name, "_test")
		rules, known := mayImport[name]
		if !known {
			violations = append(violations, name+": not in mayImport (docs/architecture.md)")
			continue
		}
		if isTest {
			rules = append(append(append([]string{}, rules...), testHelpers...), name)
			if strings.HasPrefix(name, "router") || strings.HasPrefix(name, "app") {
				rules = append(rules, "router/catalogtest")
			}
		}
		for _, imp := range strings.Split(imports, ",") {
			if strings.HasPrefix(name, "handlers/") && !isTest {
				for _, f := range forbiddenInHandlers {
					if imp == f || strings.HasPrefix(imp, f+"/") {
						violations = append(violations, name+" imports "+imp+": handlers hold business rules, no Kafka, HTTP or flags")
					}
				}
			}
			imp, ours := strings.CutPrefix(imp, module)
			imp, _, _ = strings.Cut(imp, " ")
			if ours && !allowed(rules, imp) {
				violations = append(violations, name+" imports "+imp)
			}
		}
	}
	require.Empty(t, violations)
}

// testOnlyModules are what the tests alone need (the chart's check decodes
// into the Kubernetes API types): the promoflow binary never links them.
var testOnlyModules = []string{"k8s.io/", "sigs.k8s.io/", "github.com/prometheus-operator/"}

// TestArchitecture_BinaryLinksNoTestOnlyModule reads the binary's
// dependencies (its tests left out) from go list -deps.
func TestArchitecture_BinaryLinksNoTestOnlyModule(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./app")
	cmd.Dir = ".."
	out, err := cmd.Output()
	require.NoError(t, err)
	var linked []string
	for _, pkg := range strings.Fields(string(out)) {
		if hasAnyPrefix(pkg, testOnlyModules) {
			linked = append(linked, pkg)
		}
	}
	require.Empty(t, linked, "the promoflow binary links test-only modules")
}
