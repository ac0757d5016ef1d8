package kubeauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf for cn and orgs with the extended key usages given.
func (c *testCA) issue(t *testing.T, cn string, orgs []string, usages ...x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert
}

func withCert(r *http.Request, certs ...*x509.Certificate) *http.Request {
	r.TLS = &tls.ConnectionState{PeerCertificates: certs}
	return r
}

func TestRequestHeaderTrustsOnlyAVerifiedProxy(t *testing.T) {
	proxyCA, otherCA := newCA(t, "front-proxy-ca"), newCA(t, "another-ca")
	ca, err := StaticCA("front-proxy CA", proxyCA.pem)
	if err != nil {
		t.Fatal(err)
	}
	names := HeaderNames{AllowedNames: []string{"front-proxy-client"}, User: []string{"X-Remote-User"},
		UID: []string{"X-Remote-Uid"}, Group: []string{"X-Remote-Group"}, ExtraPrefixes: []string{"X-Remote-Extra-"}}
	a := RequestHeader(ca, func() HeaderNames { return names })
	req := func() *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Remote-User", "alice")
		r.Header.Set("X-Remote-Uid", "u-1")
		r.Header.Add("X-Remote-Group", "devs")
		r.Header.Add("X-Remote-Group", "system:authenticated")
		r.Header.Add("X-Remote-Extra-Team%2Fname", "blue")
		return r
	}
	client := x509.ExtKeyUsageClientAuth

	for _, tc := range []struct {
		name    string
		r       *http.Request
		wantErr string
	}{
		{"headers without a certificate", req(), ""},
		{"a certificate of another CA", withCert(req(), otherCA.issue(t, "front-proxy-client", nil, client)), "certificate signed by unknown authority"},
		{"a name not allowed", withCert(req(), proxyCA.issue(t, "mallory", nil, client)), "not one of the proxies allowed"},
		{"a certificate not for client authentication", withCert(req(), proxyCA.issue(t, "front-proxy-client", nil, x509.ExtKeyUsageServerAuth)), "incompatible key usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, ok, err := a.Authenticate(tc.r)
			if ok || u != nil {
				t.Fatalf("authenticated as %+v", u)
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}

	u, ok, err := a.Authenticate(withCert(req(), proxyCA.issue(t, "front-proxy-client", nil, client)))
	if err != nil || !ok {
		t.Fatalf("the proxy's request: %v %v", ok, err)
	}
	if u.Name != "alice" || u.UID != "u-1" || !slices.Equal(u.Groups, []string{"devs", "system:authenticated"}) ||
		!slices.Equal(u.Extra["team/name"], []string{"blue"}) {
		t.Fatalf("user %+v", u)
	}
	// No user header: nobody.
	r := withCert(httptest.NewRequest("GET", "/", nil), proxyCA.issue(t, "front-proxy-client", nil, client))
	if u, ok, _ := a.Authenticate(r); ok || u != nil {
		t.Fatalf("a proxy naming nobody authenticated %+v", u)
	}
}

func TestHeaderNamesThatDoNotParseTrustNoProxy(t *testing.T) {
	kube := fake.NewClientset()
	cm := &ConfigMap{Kube: kube, Namespace: "kube-system", Name: "auth"}
	cm.store(map[string]string{"names": `["front-proxy-client"]`, "user": `["X-Remote-User"]`})
	names := HeaderNamesFrom(cm, "names", "user", "uid", "group", "extra")
	if n := names(); !slices.Equal(n.AllowedNames, []string{"front-proxy-client"}) || !slices.Equal(n.User, []string{"X-Remote-User"}) {
		t.Fatalf("names %+v", n)
	}
	// A broken allowed-names list must not read as "any name".
	cm.store(map[string]string{"names": `front-proxy-client`, "user": `["X-Remote-User"]`})
	if n := names(); len(n.User) != 0 {
		t.Fatalf("names that do not parse still name a user header: %+v", n)
	}
}

func TestClientCertIsItsCommonNameAndOrganisations(t *testing.T) {
	root := newCA(t, "client-ca")
	ca, err := StaticCA("client CA", root.pem)
	if err != nil {
		t.Fatal(err)
	}
	a := ClientCert(ca)
	u, ok, err := a.Authenticate(withCert(httptest.NewRequest("GET", "/", nil), root.issue(t, "bob", []string{"ops"}, x509.ExtKeyUsageClientAuth)))
	if err != nil || !ok || u.Name != "bob" || !slices.Equal(u.Groups, []string{"ops"}) {
		t.Fatalf("got %+v %v %v", u, ok, err)
	}
	if _, ok, err := a.Authenticate(withCert(httptest.NewRequest("GET", "/", nil), root.issue(t, "", []string{"system:masters"}, x509.ExtKeyUsageClientAuth))); ok || err == nil {
		t.Fatal("a certificate without a common name was taken")
	}
	if u, ok, err := a.Authenticate(httptest.NewRequest("GET", "/", nil)); ok || u != nil || err != nil {
		t.Fatal("no certificate must be no opinion")
	}
}

func TestACABundleThatDoesNotParseKeepsTheOneBefore(t *testing.T) {
	root := newCA(t, "a")
	ca, err := StaticCA("test", root.pem)
	if err != nil {
		t.Fatal(err)
	}
	before := ca.Pool()
	if err := ca.set([]byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")); err == nil {
		t.Fatal("a broken bundle was taken")
	}
	if ca.Pool() != before {
		t.Fatal("a broken bundle replaced the one before")
	}
	if _, err := StaticCA("empty", nil); err == nil {
		t.Fatal("an empty static bundle was taken")
	}
}

func TestBearerToken(t *testing.T) {
	ws := base64.RawURLEncoding.EncodeToString([]byte("ws-token"))
	for _, tc := range []struct {
		header, value string
		want          string
		ok            bool
	}{
		{"Authorization", "Bearer abc", "abc", true},
		{"Authorization", "bearer abc", "abc", true},
		{"Authorization", "Bearer ", "", false},
		{"Authorization", "Basic abc", "", false},
		{"Authorization", "Bearer a b", "", false},
		{"Sec-WebSocket-Protocol", "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io." + ws, "ws-token", true},
		{"Sec-WebSocket-Protocol", "base64url.bearer.authorization.k8s.io.!!!", "", false},
		{"Sec-WebSocket-Protocol", "v5.channel.k8s.io", "", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set(tc.header, tc.value)
		if got, ok := BearerToken(r); got != tc.want || ok != tc.ok {
			t.Errorf("%s: %q gave %q %v, want %q %v", tc.header, tc.value, got, ok, tc.want, tc.ok)
		}
	}
}

// reviews scripts the API server's TokenReview answers and counts them.
func tokenServer(answer func(tr *authnv1.TokenReview) (*authnv1.TokenReview, error)) (*fake.Clientset, *atomic.Int32) {
	kube := fake.NewClientset()
	var n atomic.Int32
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		got, err := answer(tr.DeepCopy())
		return true, got, err
	})
	return kube, &n
}

func bearer(tok string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	return r
}

// jwtFor is a token shaped as a JWT whose payload names aud, as the API
// server issues them; TokenReview (here the test's) says whether it is
// valid.
func jwtFor(name string, aud ...string) string {
	payload, _ := json.Marshal(map[string]any{"sub": name, "aud": aud})
	return "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString(payload) + ".c2lnbmF0dXJl"
}

func TestTokenReviewerAsksForItsAudienceAndKeepsAnswers(t *testing.T) {
	forExec, noAudience, unknown := jwtFor("for-exec", "exec"), jwtFor("no-audience", "exec"), jwtFor("unknown", "exec")
	kube, reviews := tokenServer(func(tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
		if !slices.Equal(tr.Spec.Audiences, []string{"exec"}) {
			return nil, fmt.Errorf("asked for audiences %v", tr.Spec.Audiences)
		}
		switch tr.Spec.Token {
		case forExec:
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"exec"}, User: authnv1.UserInfo{Username: "alice", Groups: []string{"devs"}}}
		case noAudience:
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice"}}
		}
		return tr, nil
	})
	a := &TokenReviewer{Kube: kube, Audience: "exec", TTL: time.Minute}
	u, ok, err := a.Authenticate(bearer(forExec))
	if err != nil || !ok || u.Name != "alice" || !slices.Equal(u.Groups, []string{"devs"}) {
		t.Fatalf("got %+v %v %v", u, ok, err)
	}
	for _, tok := range []string{noAudience, unknown} {
		if u, ok, err := a.Authenticate(bearer(tok)); ok || u != nil || err != nil {
			t.Errorf("token %s: got %+v %v %v, want refused", tok, u, ok, err)
		}
	}
	n := reviews.Load()
	// Answers, yes and no, are kept.
	for _, tok := range []string{forExec, unknown} {
		if _, _, err := a.Authenticate(bearer(tok)); err != nil {
			t.Fatal(err)
		}
	}
	if got := reviews.Load(); got != n {
		t.Fatalf("%d more reviews for tokens answered before", got-n)
	}
	// A reviewer for another audience does not take this one's answers.
	other := &TokenReviewer{Kube: kube, Audience: "other", TTL: time.Minute}
	if _, ok, _ := other.Authenticate(bearer(forExec)); ok {
		t.Fatal("a token for exec passed a reviewer for another audience")
	}
}

// A token valid for the exec API and for anything else (the API server)
// is one a node's controller, which sees it, could use there: refused
// before any review, though the API server would say it is valid for the
// exec audience; and so is a token that is no JWT, whose audiences
// nothing shows.
func TestTokenReviewerRefusesATokenValidElsewhereToo(t *testing.T) {
	kube, reviews := tokenServer(func(tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
		tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"exec"}, User: authnv1.UserInfo{Username: "alice"}}
		return tr, nil
	})
	a := &TokenReviewer{Kube: kube, Audience: "exec", TTL: time.Minute}
	for tok, want := range map[string]string{
		jwtFor("both", "exec", "https://kubernetes.default.svc"): `issued for 2 audiences, not for "exec" alone`,
		jwtFor("api", "https://kubernetes.default.svc"):          `issued for 1 audiences, not for "exec" alone`,
		"an-opaque-static-token":                                 "not a JWT",
	} {
		u, ok, err := a.Authenticate(bearer(tok))
		if ok || u != nil || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %+v %v %v, want refused saying %q", u, ok, err, want)
		}
	}
	if n := reviews.Load(); n != 0 {
		t.Errorf("%d reviews of tokens refused for their audiences", n)
	}
}

func TestTokenReviewerRetriesAnOverloadedServerAndKeepsNoFailure(t *testing.T) {
	var fail atomic.Int32
	fail.Store(2)
	kube, reviews := tokenServer(func(tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
		if fail.Add(-1) >= 0 {
			return nil, apierrors.NewTooManyRequests("busy", 0)
		}
		tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"exec"}, User: authnv1.UserInfo{Username: "alice"}}
		return tr, nil
	})
	a := &TokenReviewer{Kube: kube, Audience: "exec", TTL: time.Minute}
	if u, ok, err := a.Authenticate(bearer(jwtFor("t", "exec"))); err != nil || !ok || u.Name != "alice" {
		t.Fatalf("got %+v %v %v after two busy answers", u, ok, err)
	}
	if got := reviews.Load(); got != 3 {
		t.Fatalf("%d reviews, want 3", got)
	}

	// An answer that says the request is wrong is not retried, and not kept.
	kube, reviews = tokenServer(func(*authnv1.TokenReview) (*authnv1.TokenReview, error) {
		return nil, apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("no RBAC"))
	})
	a = &TokenReviewer{Kube: kube, Audience: "exec", TTL: time.Minute}
	for range 2 {
		if _, ok, err := a.Authenticate(bearer(jwtFor("t", "exec"))); ok || err == nil {
			t.Fatal("a forbidden review authenticated")
		}
	}
	if got := reviews.Load(); got != 2 {
		t.Fatalf("%d reviews, want 2: one each, no retry, nothing kept", got)
	}
}

func TestAccessReviewerAsksForTheWholeQuestion(t *testing.T) {
	kube := fake.NewClientset()
	var asked []authzv1.SubjectAccessReviewSpec
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		asked = append(asked, sar.Spec)
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = slices.Contains(sar.Spec.Groups, "devs") && ra.Verb == "create" && ra.Subresource == "exec"
		if !sar.Status.Allowed {
			sar.Status.Reason = "no rule"
		}
		return true, sar, nil
	})
	a := &AccessReviewer{Kube: kube, TTL: time.Minute}
	at := Attributes{User: &User{Name: "alice", Groups: []string{"devs"}, Extra: map[string][]string{"k": {"v"}}}, Verb: "create",
		Namespace: "team", Group: "g", Version: "v1", Resource: "sessionclaims", Subresource: "exec", Name: "s1"}
	if ok, _, err := a.Authorize(context.Background(), at); !ok || err != nil {
		t.Fatalf("allowed %v %v", ok, err)
	}
	got := asked[0]
	if got.User != "alice" || got.ResourceAttributes.Namespace != "team" || got.ResourceAttributes.Name != "s1" ||
		got.ResourceAttributes.Group != "g" || got.ResourceAttributes.Resource != "sessionclaims" || !slices.Equal(got.Extra["k"], []string{"v"}) {
		t.Fatalf("asked %+v", got)
	}
	// The same question again is answered from the cache; any other part
	// changed is a new question.
	if ok, _, _ := a.Authorize(context.Background(), at); !ok || len(asked) != 1 {
		t.Fatalf("asked %d times", len(asked))
	}
	other := at
	other.User = &User{Name: "alice", Groups: []string{"guests"}}
	if ok, reason, _ := a.Authorize(context.Background(), other); ok || reason != "no rule" {
		t.Fatalf("another group's question was answered %v %q", ok, reason)
	}
	other = at
	other.Subresource = "files"
	if ok, _, _ := a.Authorize(context.Background(), other); ok || len(asked) != 3 {
		t.Fatalf("another subresource: %v after %d questions", ok, len(asked))
	}
}

// A question's size is the caller's: the claim's name and namespace come
// from the request's path, which may be as long as the server's header
// limit (a megabyte). Each answer is kept under a key of fixed size, so
// callers asking ever new long questions cannot make the cache hold
// cacheEntries times a megabyte.
func TestAccessAnswersKeepNoneOfTheQuestion(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		return true, sar, nil
	})
	a := &AccessReviewer{Kube: kube, TTL: time.Minute}
	// '<' is written as \u003c in JSON: six bytes for each of the path's three.
	long := strings.Repeat("<", 16<<10)
	const questions = 256
	for i := range questions {
		at := Attributes{User: &User{Name: "mallory"}, Verb: "create", Namespace: "team", Group: "g", Version: "v1",
			Resource: "sessionclaims", Subresource: "exec", Name: long + fmt.Sprint(i)}
		if ok, _, err := a.Authorize(context.Background(), at); ok || err != nil {
			t.Fatalf("allowed %v %v", ok, err)
		}
		kube.ClearActions()
	}
	kept := 0
	for k := range a.cache.m {
		kept += len(k)
	}
	if len(a.cache.m) != questions {
		t.Fatalf("%d answers kept, want %d", len(a.cache.m), questions)
	}
	if per := kept / questions; per > 64 {
		t.Fatalf("the cache keeps %d bytes of keys for %d answers, %d each, for names of %d bytes", kept, questions, per, len(long))
	}
}

func TestAnswersStayBounded(t *testing.T) {
	var c answers[int]
	for i := range 3 * cacheEntries {
		c.put(fmt.Sprint(i), i, time.Hour)
	}
	if n := len(c.m); n > cacheEntries {
		t.Fatalf("%d answers kept, at most %d", n, cacheEntries)
	}
	if v, ok := c.get(fmt.Sprint(3*cacheEntries - 1)); !ok || v != 3*cacheEntries-1 {
		t.Fatal("the newest answer is gone")
	}
	c.put("short", 1, time.Nanosecond)
	time.Sleep(time.Millisecond)
	if _, ok := c.get("short"); ok {
		t.Fatal("an expired answer was given")
	}
}

func TestCAFromAConfigMapFollowsIt(t *testing.T) {
	kube := fake.NewClientset()
	cm := &ConfigMap{Kube: kube, Namespace: "kube-system", Name: "auth"}
	ca := CAFrom("test", cm, "ca", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cm.Load(ctx); err != nil {
		t.Fatalf("a missing ConfigMap must read as empty: %v", err)
	}
	go cm.Run(ctx, func(err error) { t.Log(err) })
	first, second := newCA(t, "first"), newCA(t, "second")
	leaf := second.issue(t, "bob", nil, x509.ExtKeyUsageClientAuth)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "auth"}, Data: map[string]string{"ca": string(first.pem)}}
	if _, err := kube.CoreV1().ConfigMaps("kube-system").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the created bundle was not loaded", func() bool { return ca.Pool() != nil })
	if _, err := verify(withCert(httptest.NewRequest("GET", "/", nil), leaf), ca); err == nil {
		t.Fatal("a certificate of the second CA passed before the ConfigMap named it")
	}
	obj.Data["ca"] = string(second.pem)
	if _, err := kube.CoreV1().ConfigMaps("kube-system").Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the updated bundle was not loaded", func() bool {
		_, err := verify(withCert(httptest.NewRequest("GET", "/", nil), leaf), ca)
		return err == nil
	})
	if err := kube.CoreV1().ConfigMaps("kube-system").Delete(ctx, "auth", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a deleted ConfigMap still trusted its CA", func() bool { return ca.Pool() == nil })
}
