package execapi

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/cireilclaw/sandbox-controller/api/v1alpha1"
	"github.com/cireilclaw/sandbox-controller/bridge/instance"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// What DelegatingAuth asks the API server and what it accepts as an
// answer, with the API server's review endpoints scripted. The real TokenReview is
// exercised in test/e2e/execapi.
func TestTokensNeedTheExecAudience(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answer    []string // the audiences the review confirms
		wantCode  int
		wantInMsg string
	}{
		{"the review confirms the exec audience", []string{DefaultAudience}, http.StatusNotFound, "not found"},
		{"the review confirms no audience", nil, http.StatusUnauthorized, "accepts only tokens issued for audience"},
		{"the review confirms only the API server's audience", []string{"https://kubernetes.default.svc"}, http.StatusUnauthorized, "kubectl create token SERVICE_ACCOUNT --audience " + DefaultAudience},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var asked [][]string
			// The API server's two review endpoints, scripted.
			apiServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case "/apis/authentication.k8s.io/v1/tokenreviews":
					var tr authnv1.TokenReview
					if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
						t.Error(err)
					}
					mu.Lock()
					asked = append(asked, tr.Spec.Audiences)
					mu.Unlock()
					tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice"}, Audiences: tc.answer}
					_ = json.NewEncoder(w).Encode(&tr)
				case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
					var sar authzv1.SubjectAccessReview
					if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
						t.Error(err)
					}
					sar.Status.Allowed = true
					_ = json.NewEncoder(w).Encode(&sar)
				default:
					http.NotFound(w, r)
				}
			}))
			defer apiServer.Close()
			// The scripted server speaks JSON.
			kube, err := kubernetes.NewForConfig(&rest.Config{Host: apiServer.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
			if err != nil {
				t.Fatal(err)
			}
			auth, err := DelegatingAuth(kube, Config{})
			if err != nil {
				t.Fatal(err)
			}
			scheme := runtime.NewScheme()
			if err := v1alpha1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			s, err := New(Config{}, Options{
				Reader:     fake.NewClientBuilder().WithScheme(scheme).Build(),
				Runtimes:   map[v1alpha1.Backend]runtimes.Runtime{},
				Host:       instance.Host{AreasRoot: t.TempDir()},
				Auth:       auth,
				Registerer: prometheus.NewRegistry(),
				Log:        logr.Discard(),
			})
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest("GET", "/api/v1alpha1/namespaces/team/sessionclaims/s1/files/workspace", nil)
			// A token of the exec audience alone, as TokenRequest issues
			// one: the review decides whether it is valid.
			payload, _ := json.Marshal(map[string]any{"aud": []string{DefaultAudience}})
			req.Header.Set("Authorization", "Bearer eyJhbGciOiJSUzI1NiJ9."+base64.RawURLEncoding.EncodeToString(payload)+".c2ln")
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantInMsg) {
				t.Fatalf("got %d %s, want %d containing %q", rec.Code, rec.Body.String(), tc.wantCode, tc.wantInMsg)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(asked) != 1 || !slices.Equal(asked[0], []string{DefaultAudience}) {
				t.Fatalf("TokenReviews asked for audiences %v, want one review for [%s]", asked, DefaultAudience)
			}
		})
	}
}
