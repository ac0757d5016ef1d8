package controllers

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// scriptedListWatch fails its first calls with the errors given, then answers.
type scriptedListWatch struct {
	errs  []error
	calls int
}

func (s *scriptedListWatch) next() error {
	s.calls++
	if s.calls <= len(s.errs) {
		return s.errs[s.calls-1]
	}
	return nil
}

func (s *scriptedListWatch) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	if err := s.next(); err != nil {
		return nil, err
	}
	return &metav1.List{}, nil
}

func (s *scriptedListWatch) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	if err := s.next(); err != nil {
		return nil, err
	}
	return watch.NewEmptyWatch(), nil
}

func TestPatientListWatchRetriesOnlyWhileTheAPIServerIsAway(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "sandboxes"}, "", errors.New("no"))
	unavailable := apierrors.NewServiceUnavailable("starting")
	for _, tc := range []struct {
		name      string
		errs      []error
		wantErr   bool
		wantCalls int
	}{
		{"connection refused is retried until the server answers", []error{refused, refused, refused}, false, 4},
		{"service unavailable is retried", []error{unavailable}, false, 2},
		{"a refusal by the server is returned at once", []error{forbidden}, true, 1},
		{"too many requests is left to the reflector's back-off", []error{apierrors.NewTooManyRequests("slow down", 1)}, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, op := range []string{"list", "watch"} {
				s := &scriptedListWatch{errs: tc.errs}
				p := &patientListWatch{lw: s, every: time.Millisecond}
				var err error
				if op == "list" {
					_, err = p.ListWithContext(context.Background(), metav1.ListOptions{})
				} else {
					_, err = p.WatchWithContext(context.Background(), metav1.ListOptions{})
				}
				if (err != nil) != tc.wantErr || s.calls != tc.wantCalls {
					t.Fatalf("%s: %v after %d calls, want error %v after %d", op, err, s.calls, tc.wantErr, tc.wantCalls)
				}
			}
		})
	}

	t.Run("after an absence the server must be ready before it is asked again", func(t *testing.T) {
		for _, op := range []string{"list", "watch"} {
			s := &scriptedListWatch{errs: []error{refused}}
			var asked, callsWhenReady int
			p := &patientListWatch{lw: s, every: time.Millisecond, ready: func(context.Context) error {
				asked++
				if asked < 3 {
					return unavailable
				}
				callsWhenReady = s.calls
				return nil
			}}
			var err error
			if op == "list" {
				_, err = p.ListWithContext(context.Background(), metav1.ListOptions{})
			} else {
				_, err = p.WatchWithContext(context.Background(), metav1.ListOptions{})
			}
			// Refused once: then only readiness is asked (twice not
			// ready, then ready) before the second and last call.
			if err != nil || s.calls != 2 || asked != 3 || callsWhenReady != 1 {
				t.Fatalf("%s: %v after %d calls, readiness asked %d times (ready after call %d); want success after 2 calls, 3 asks, ready after call 1",
					op, err, s.calls, asked, callsWhenReady)
			}
			if p.away.Load() {
				t.Fatalf("%s: still marked away after the server came back", op)
			}
		}
	})

	t.Run("a server that never went away is not asked for readiness", func(t *testing.T) {
		s := &scriptedListWatch{}
		p := &patientListWatch{lw: s, every: time.Millisecond, ready: func(context.Context) error {
			t.Fatal("readiness asked of a server that answered")
			return nil
		}}
		if _, err := p.WatchWithContext(context.Background(), metav1.ListOptions{}); err != nil || s.calls != 1 {
			t.Fatalf("%v after %d calls", err, s.calls)
		}
	})

	t.Run("a stopped informer stops asking", func(t *testing.T) {
		s := &scriptedListWatch{errs: make([]error, 1000)}
		for i := range s.errs {
			s.errs[i] = refused
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		p := &patientListWatch{lw: s, every: time.Hour}
		if _, err := p.WatchWithContext(ctx, metav1.ListOptions{}); err == nil || s.calls != 1 {
			t.Fatalf("cancelled watch: %v after %d calls, want the refusal after 1", err, s.calls)
		}
	})
}
