package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

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
	if err := applyChartRBACOnce(ctx, c); err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, name+".kubeconfig")
	return path, ServiceAccountKubeconfig(ctx, c, Release.Namespace, name, path)
}

// ServiceAccountKubeconfig writes to path a kubeconfig for c's API server
// that authenticates with a token of ServiceAccount namespace/name
// (created if missing), so a client run with it holds exactly that
// account's permissions.
func ServiceAccountKubeconfig(ctx context.Context, c *cluster.Cluster, namespace, name, path string) error {
	token, err := serviceAccountToken(ctx, c.Clientset(), namespace, name, nil)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.CA.CertPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = "local"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// Written aside and renamed: tests in parallel rewrite the same
	// account's kubeconfig while processes started by others read it.
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp.Close()
	if err := clientcmd.WriteToFile(*cfg, tmp.Name()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// PaperclipServerRBAC is the Role and RoleBinding the Paperclip adapter's
// README (adapters/paperclip/README.md, "What it needs in the cluster")
// tells an operator to give the Paperclip server's ServiceAccount, read
// from the README itself: a test that runs the adapter with them holds
// exactly what the README documents, no more, so a permission the adapter
// needs and the README leaves out fails that test.
func PaperclipServerRBAC() (*rbacv1.Role, *rbacv1.RoleBinding, error) {
	readme := filepath.Join(Root(), "adapters", "paperclip", "README.md")
	data, err := os.ReadFile(readme)
	if err != nil {
		return nil, nil, err
	}
	// The first yaml block holding a Role.
	var block string
	for _, part := range strings.Split(string(data), "```yaml\n")[1:] {
		body, _, ok := strings.Cut(part, "```")
		if ok && strings.Contains(body, "kind: Role\n") {
			block = body
			break
		}
	}
	if block == "" {
		return nil, nil, fmt.Errorf("%s: no yaml block with the server's Role", readme)
	}
	// The block is indented as a list item's: take that indent off.
	lines := strings.Split(block, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, strings.Repeat(" ", indent))
	}
	block = strings.Join(lines, "\n")
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	for _, doc := range strings.Split(block, "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", readme, err)
		}
		switch meta.Kind {
		case "Role":
			role = &rbacv1.Role{}
			err = yaml.UnmarshalStrict([]byte(doc), role)
		case "RoleBinding":
			binding = &rbacv1.RoleBinding{}
			err = yaml.UnmarshalStrict([]byte(doc), binding)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: the %s: %w", readme, meta.Kind, err)
		}
	}
	if role == nil || binding == nil || len(binding.Subjects) != 1 || binding.Subjects[0].Kind != rbacv1.ServiceAccountKind {
		return nil, nil, fmt.Errorf("%s: want a Role and a RoleBinding of one ServiceAccount to it", readme)
	}
	return role, binding, nil
}

// ApplyPaperclipServerRBAC creates the README's Role and RoleBinding
// (PaperclipServerRBAC) and the ServiceAccount they bind in namespace, as
// an operator whose Paperclip runs there applies them (the README's
// example namespace is its own), and returns that ServiceAccount's name.
func ApplyPaperclipServerRBAC(ctx context.Context, cs kubernetes.Interface, namespace string) (name string, err error) {
	role, binding, err := PaperclipServerRBAC()
	if err != nil {
		return "", err
	}
	role.Namespace, binding.Namespace, binding.Subjects[0].Namespace = namespace, namespace, namespace
	if _, err := cs.RbacV1().Roles(role.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	if _, err := cs.RbacV1().RoleBindings(binding.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	sa := binding.Subjects[0]
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa.Name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return sa.Name, nil
}
