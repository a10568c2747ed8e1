package harness

import (
	"context"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// ServiceAccountToken creates ServiceAccount namespace/name, bound by a
// Role in its namespace to rules (none: no permission at all), and returns
// a token for it for audiences (none: the API server's), as a client such
// as the Paperclip server would hold.
func ServiceAccountToken(ctx context.Context, c *cluster.Cluster, namespace, name string, rules []rbacv1.PolicyRule, audiences ...string) (string, error) {
	cs := c.Clientset()
	if len(rules) > 0 {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
		if _, err := cs.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}}
		if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
	}
	return serviceAccountToken(ctx, cs, namespace, name, audiences)
}

// serviceAccountToken creates ServiceAccount namespace/name if it is
// missing and returns a six-hour token for it for audiences.
func serviceAccountToken(ctx context.Context, cs kubernetes.Interface, namespace, name string, audiences []string) (string, error) {
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](6 * 3600), Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// LogReaderRules is what a consumer of the relay needs: the same right
// `kubectl logs` needs.
var LogReaderRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}}}

// ChartServiceAccountKubeconfig applies the chart's RBAC (ChartRBAC) and
// writes a kubeconfig with a token of the chart's ServiceAccount name, so
// a binary run with it holds exactly what the chart grants it.
func ChartServiceAccountKubeconfig(ctx context.Context, c *cluster.Cluster, name string) (string, error) {
	cs := c.Clientset()
	if err := ApplyChartRBAC(ctx, cs); err != nil {
		return "", err
	}
	namespace := Release.Namespace
	token, err := serviceAccountToken(ctx, cs, namespace, name, nil)
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.CA.CertPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = "local"
	path := filepath.Join(c.Dir, name+".kubeconfig")
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", err
	}
	return path, clientcmd.WriteToFile(*cfg, path)
}
