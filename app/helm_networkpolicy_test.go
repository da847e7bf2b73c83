package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// chartNetwork is what the chart renders that NetworkPolicies govern: the
// policies, and the labels of each pod it runs.
type chartNetwork struct {
	policies []*networkingv1.NetworkPolicy
	pods     map[string]labels.Set
}

func networkOf(t *testing.T, objs []runtime.Object) chartNetwork {
	t.Helper()
	n := chartNetwork{pods: map[string]labels.Set{}}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *networkingv1.NetworkPolicy:
			n.policies = append(n.policies, o)
		case *appsv1.Deployment:
			n.pods[o.Name] = o.Spec.Template.Labels
		case *batchv1.Job:
			n.pods[o.Name] = o.Spec.Template.Labels
		}
	}
	return n
}

// policyOf is the one policy that selects the pod, failing when none or
// several do: rules of several policies add up, and the test reads one.
func (n chartNetwork) policyOf(t *testing.T, pod string) *networkingv1.NetworkPolicy {
	t.Helper()
	var found []*networkingv1.NetworkPolicy
	for _, p := range n.policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		require.NoError(t, err, p.Name)
		if sel.Matches(n.pods[pod]) {
			found = append(found, p)
		}
	}
	require.Len(t, found, 1, "pod %s: one NetworkPolicy selects it", pod)
	return found[0]
}

// policyPort is a port of a policy rule.
type policyPort struct {
	Port     int
	Protocol corev1.Protocol
}

func portsOf(ports []networkingv1.NetworkPolicyPort) []policyPort {
	out := make([]policyPort, 0, len(ports))
	for _, p := range ports {
		out = append(out, policyPort{p.Port.IntValue(), *p.Protocol})
	}
	return out
}

// egressPorts are the ports a policy lets a pod connect to, and for each
// the number of peers it is limited to (0: any address).
func egressPorts(p *networkingv1.NetworkPolicy) map[policyPort]int {
	out := map[policyPort]int{}
	for _, rule := range p.Spec.Egress {
		for _, port := range portsOf(rule.Ports) {
			out[port] = len(rule.To)
		}
	}
	return out
}

// TestHelm_NetworkPolicyLetsInTheAPIsAndOutOnlyToTheStoresDNSAndTraces:
// every pod of the chart is under one NetworkPolicy; each process takes
// connections on its port alone (from anywhere by default, from the peers of
// networkPolicy.ingressFrom when set), the Jobs on none; each connects to
// DNS, PostgreSQL, the ports of kafka.brokers and OTLP, and nowhere else;
// networkPolicy.enabled=false renders none.
func TestHelm_NetworkPolicyLetsInTheAPIsAndOutOnlyToTheStoresDNSAndTraces(t *testing.T) {
	t.Parallel()
	dns := []policyPort{{53, corev1.ProtocolUDP}, {53, corev1.ProtocolTCP}}
	otlp := []policyPort{{4317, corev1.ProtocolTCP}, {4318, corev1.ProtocolTCP}}
	for _, tc := range []struct {
		name, values string
		ingressFrom  int // peers the processes' ports are open to; 0: any
		postgres     []int
		peers        map[int]int // peers an egress port is limited to, where some
		kafka        int
	}{
		{name: "default values", postgres: []int{5432}, kafka: 9092},
		{name: "SASL_SSL and PgBouncer", values: chartSASLValues, ingressFrom: 1, postgres: []int{5432, 6432},
			peers: map[int]int{53: 1, 5432: 1, 6432: 1}, kafka: 9093},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := networkOf(t, renderChart(t, tc.values))
			require.NotEmpty(t, n.pods)
			want := map[policyPort]int{{tc.kafka, corev1.ProtocolTCP}: 0}
			for _, p := range append(append(dns, otlp...), portsFor(tc.postgres)...) {
				want[p] = tc.peers[p.Port]
			}
			for pod, podLabels := range n.pods {
				p := n.policyOf(t, pod)
				require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
					p.Spec.PolicyTypes, "%s: both directions are governed", pod)
				require.Equal(t, want, egressPorts(p), "%s: egress to DNS, PostgreSQL, Kafka and OTLP only", pod)
				component := podLabels["app.kubernetes.io/component"]
				port := map[string]int{"promotion": 8080, "catalog": 8081}[component]
				if port == 0 {
					require.Empty(t, p.Spec.Ingress, "%s: a Job takes no connection", pod)
					continue
				}
				require.Len(t, p.Spec.Ingress, 2, pod)
				require.Equal(t, []policyPort{{port, corev1.ProtocolTCP}}, portsOf(p.Spec.Ingress[0].Ports), "%s: its API port", pod)
				require.Len(t, p.Spec.Ingress[0].From, tc.ingressFrom, "%s: from anywhere, or from networkPolicy.ingressFrom", pod)
				internal := map[string]int{"promotion": 9080, "catalog": 9081}[component]
				require.Equal(t, []policyPort{{internal, corev1.ProtocolTCP}}, portsOf(p.Spec.Ingress[1].Ports), "%s: its internal port", pod)
				require.Len(t, p.Spec.Ingress[1].From, 1, "%s: the internal port from networkPolicy.internalFrom, by default the release's pods, never anywhere", pod)
			}
		})
	}
	t.Run("disabled", func(t *testing.T) {
		require.Empty(t, networkOf(t, renderChart(t, "", "networkPolicy.enabled=false")).policies)
	})
}

func portsFor(ports []int) []policyPort {
	out := make([]policyPort, 0, len(ports))
	for _, p := range ports {
		out = append(out, policyPort{p, corev1.ProtocolTCP})
	}
	return out
}
