package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Authorizer decides whether a request may read runs of a namespace.
type Authorizer interface {
	// Authenticate returns the caller, or an error with the HTTP status
	// (401) to answer.
	Authenticate(r *http.Request) (*authnv1.UserInfo, error)
	// Allowed reports whether the caller may read logs in namespace.
	Allowed(ctx context.Context, user *authnv1.UserInfo, namespace string) (bool, error)
}

// errUnauthenticated is answered with 401; errTokenRefused wraps it for a
// token the API server did not accept for the relay.
var errUnauthenticated = errors.New("a Kubernetes bearer token is required (Authorization: Bearer …)")

// refused says why a token was not accepted, without saying which reason
// applied (that would help a guesser).
func (a *KubeAuth) refused() error {
	if len(a.Audiences) == 0 {
		return fmt.Errorf("%w: the token was not accepted: it is invalid or expired", errUnauthenticated)
	}
	return fmt.Errorf("%w: the token was not accepted: it is invalid, expired, or not made for audience %s (kubectl create token <serviceaccount> --audience %s)",
		errUnauthenticated, strings.Join(a.Audiences, " or "), a.Audiences[0])
}

// KubeAuth authenticates bearer tokens with a TokenReview and authorizes
// with a SubjectAccessReview for get pods/log in the run's namespace, the
// permission `kubectl logs` needs. Decisions are cached briefly, as
// controller-runtime's delegating filters do.
type KubeAuth struct {
	Client kubernetes.Interface
	// Audiences the token must be for; empty accepts the API server's.
	Audiences []string
	// Clock times the cache lifetimes. Default the real clock.
	Clock clock.Clock

	once sync.Once
	// cache holds the decisions: a token's digest -> its user (nil:
	// refused), a caller and namespace -> allowed.
	cache *utilcache.Expiring
}

// How long a token's review, a permission and a denial are remembered.
const tokenTTL, allowTTL, denyTTL = time.Minute, 30 * time.Second, 10 * time.Second

// decisions is the cache, made at first use.
func (a *KubeAuth) decisions() *utilcache.Expiring {
	a.once.Do(func() {
		if a.Clock == nil {
			a.Clock = clock.RealClock{}
		}
		a.cache = utilcache.NewExpiringWithClock(a.Clock)
	})
	return a.cache
}

// Authenticate implements Authorizer.
func (a *KubeAuth) Authenticate(r *http.Request) (*authnv1.UserInfo, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return nil, errUnauthenticated
	}
	key := sha256.Sum256([]byte(token))
	if u, ok := a.decisions().Get(key); ok {
		if u := u.(*authnv1.UserInfo); u != nil {
			return u, nil
		}
		return nil, a.refused() // refused moments ago: no new review
	}
	tr, err := a.Client.AuthenticationV1().TokenReviews().Create(r.Context(), &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	// An authenticator may ignore the audiences asked for; the answer
	// says which it checked, and one of ours must be among them.
	if !tr.Status.Authenticated ||
		(len(a.Audiences) > 0 && !slices.ContainsFunc(a.Audiences, func(x string) bool { return slices.Contains(tr.Status.Audiences, x) })) {
		// Remembered for denyTTL, so a client retrying a bad token in a
		// loop costs the API server one review, not one per request.
		a.decisions().Set(key, (*authnv1.UserInfo)(nil), denyTTL)
		return nil, a.refused()
	}
	user := tr.Status.User
	a.decisions().Set(key, &user, tokenTTL)
	return &user, nil
}

// Allowed implements Authorizer.
func (a *KubeAuth) Allowed(ctx context.Context, user *authnv1.UserInfo, namespace string) (bool, error) {
	key := userKey(user) + "\x00" + namespace
	if ok, found := a.decisions().Get(key); found {
		return ok.(bool), nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := a.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: namespace, Verb: "get", Resource: "pods", Subresource: "log"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	ttl := denyTTL
	if sar.Status.Allowed {
		ttl = allowTTL
	}
	a.decisions().Set(key, sar.Status.Allowed, ttl)
	return sar.Status.Allowed, nil
}

// userKey identifies everything a SubjectAccessReview is decided on: two
// tokens of one user name with different groups are different callers.
func userKey(u *authnv1.UserInfo) string {
	groups := append([]string{}, u.Groups...)
	sort.Strings(groups)
	extra, _ := json.Marshal(u.Extra) // map keys are sorted
	sum := sha256.Sum256([]byte(u.Username + "\x00" + u.UID + "\x00" + strings.Join(groups, "\x00") + "\x00" + string(extra)))
	return string(sum[:])
}
