package cluster

import (
	"testing"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The cluster's DNS server answers a Service's name with its ClusterIP,
// as CoreDNS does, and a name under the cluster's domain it does not know
// with NXDOMAIN, so a resolver walks on down its search list.
func TestClusterDNSAnswersServices(t *testing.T) {
	d := &clusterDNS{cs: fake.NewClientset(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "clipjob-relay", Namespace: "clipjob-system"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.17"}})}
	ask := func(name string, typ dnsmessage.Type) dnsmessage.Message {
		t.Helper()
		q, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 7, RecursionDesired: true},
			Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}).Pack()
		if err != nil {
			t.Fatal(err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(d.answer(q)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m.ID != 7 || !m.Response {
			t.Errorf("%s: header %+v", name, m.Header)
		}
		return m
	}
	m := ask("clipjob-relay.clipjob-system.svc.cluster.local.", dnsmessage.TypeA)
	if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 || m.Answers[0].Body.(*dnsmessage.AResource).A != [4]byte{10, 0, 0, 17} {
		t.Errorf("the relay's name: %v %+v", m.RCode, m.Answers)
	}
	if m := ask("clipjob-relay.clipjob-system.svc.cluster.local.", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
		t.Errorf("AAAA of an IPv4 Service: %v %+v; want no answer, no error", m.RCode, m.Answers)
	}
	for _, name := range []string{"clipjob-relay.clipjob-system.svc.paperclip.svc.cluster.local.", "other.clipjob-system.svc.cluster.local.", "cluster.local."} {
		if m := ask(name, dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
			t.Errorf("%s: %v; want NXDOMAIN", name, m.RCode)
		}
	}
}
