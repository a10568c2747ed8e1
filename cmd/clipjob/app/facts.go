package app

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/paperclipai/clipjob/config"
	"github.com/paperclipai/clipjob/decide"
	"github.com/paperclipai/clipjob/internal/manifest"
	"github.com/paperclipai/clipjob/policy"
	"github.com/paperclipai/clipjob/templates"
)

// offlineFacts are what the CLI knows of the cluster: the manifests it was
// given. Anything else is a *policy.FactUnknown, never a guess: a Secret
// missing from the files may well exist in the cluster.
type offlineFacts struct {
	// complete: the files hold every Secret and PVC there is, so one not
	// in them does not exist (--objects-complete).
	complete    bool
	srcFile     string
	deployments []*appsv1.Deployment
	secrets     map[string]*corev1.Secret
	pvcs        map[string]*corev1.PersistentVolumeClaim
}

func newOfflineFacts() *offlineFacts {
	return &offlineFacts{secrets: map[string]*corev1.Secret{}, pvcs: map[string]*corev1.PersistentVolumeClaim{}}
}

// add takes the Deployments (when fromSource), Secrets and PVCs of set.
func (f *offlineFacts) add(set *manifest.Set, fromSource bool) {
	if fromSource {
		f.deployments = append(f.deployments, set.Deployments...)
	}
	for _, o := range set.Others {
		switch o := o.(type) {
		case *corev1.Secret:
			f.secrets[o.Namespace+"/"+o.Name] = o
		case *corev1.PersistentVolumeClaim:
			f.pvcs[o.Namespace+"/"+o.Name] = o
		}
	}
}

// lookup finds ns/name, or a manifest of that name that names no namespace.
func lookup[T any](m map[string]T, ns, name string) (T, bool) {
	if v, ok := m[ns+"/"+name]; ok {
		return v, true
	}
	v, ok := m["/"+name]
	return v, ok
}

func (f *offlineFacts) decide() decide.Facts {
	facts := decide.Facts{
		SecretMeta: func(ns, name string) (*metav1.ObjectMeta, error) {
			if s, ok := lookup(f.secrets, ns, name); ok {
				return &s.ObjectMeta, nil
			}
			if f.complete {
				return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
			}
			return nil, &policy.FactUnknown{Fact: "Secret " + ns + "/" + name, Give: "add its manifest with --objects"}
		},
		PVCs: func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			if p, ok := lookup(f.pvcs, ns, name); ok {
				return p, nil
			}
			if f.complete {
				return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
			}
			return nil, &policy.FactUnknown{Fact: "PersistentVolumeClaim " + ns + "/" + name, Give: "add its manifest with --objects"}
		},
	}
	facts.Source = f.source
	return facts
}

// source is the configured source Deployment among those given: the CLI's
// answer to what the webhook's informer holds. One that cannot be
// inherited from is the same *templates.SourceError the webhook answers.
func (f *offlineFacts) source(cfg *config.Config) (*templates.Inherited, *templates.TemplateHashes, error) {
	d := f.sourceDeployment(cfg)
	if d == nil { // readFacts refused a --source without it: none was given
		return nil, nil, &policy.FactUnknown{Fact: "source Deployment " + cfg.Source.Namespace + "/" + cfg.Source.Deployment,
			Give: "give its manifest with --source"}
	}
	inh, err := templates.InheritFromDeployment(d, cfg.Source)
	return inh, nil, err
}

func (f *offlineFacts) sourceDeployment(cfg *config.Config) *appsv1.Deployment {
	for _, d := range f.deployments {
		if d.Name == cfg.Source.Deployment && (d.Namespace == "" || d.Namespace == cfg.Source.Namespace) {
			d = d.DeepCopy()
			d.Namespace = cfg.Source.Namespace
			return d
		}
	}
	return nil
}

// readFacts reads the source file and the object files into facts; a
// source file without the configured Deployment is an error, not a fact.
func readFacts(cfg *config.Config, srcFile string, objectFiles []string) (*offlineFacts, error) {
	f := newOfflineFacts()
	if srcFile != "" {
		set, err := readManifests(srcFile, nil)
		if err != nil {
			return nil, err
		}
		f.srcFile = srcFile
		f.add(set, true)
		if f.sourceDeployment(cfg) == nil {
			return nil, fmt.Errorf("%s holds no Deployment %s/%s (the configured source)", srcFile, cfg.Source.Namespace, cfg.Source.Deployment)
		}
	}
	for _, file := range objectFiles {
		set, err := readManifests(file, nil)
		if err != nil {
			return nil, err
		}
		f.add(set, false)
	}
	return f, nil
}
