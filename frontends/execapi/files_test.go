package execapi

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
	"github.com/cireilclaw/sandbox-controller/testkit/testenv"
)

// pattern is an endless body that costs no memory: byte i is i mod 251.
type pattern struct{ off int64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte((p.off + int64(i)) % 251)
	}
	p.off += int64(len(b))
	return len(b), nil
}

// gatedBody holds its first Read until open is closed, and says when it was
// first read.
type gatedBody struct {
	r       io.Reader
	started func()
	open    <-chan struct{}
	once    sync.Once
}

func (g *gatedBody) Read(b []byte) (int, error) {
	g.once.Do(func() {
		g.started()
		<-g.open
	})
	return g.r.Read(b)
}

func (f *fixture) put(ctx context.Context, p string, body io.Reader, length int64) (int, string) {
	f.t.Helper()
	return f.putTo(ctx, "alice-token", ns, "s1", p, body, length)
}

// putTo uploads to claim in namespace n with token.
func (f *fixture) putTo(ctx context.Context, token, n, claim, p string, body io.Reader, length int64) (int, string) {
	f.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, f.srv.URL+"/api/v1alpha1/namespaces/"+n+"/sessionclaims/"+claim+"/files/"+p, body)
	if err != nil {
		f.t.Error(err)
		return 0, ""
	}
	req.ContentLength = length
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

// smallBuffers is the fixture's client transport with a 4 KiB receive
// buffer on each connection (send, with send): a client that reads the
// headers of an answer and no more holds the server's writes, and a body
// leaves it only as fast as the server reads.
func (f *fixture) smallBuffers(t *testing.T, send bool) *http.Transport {
	t.Helper()
	tr := f.srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if send {
			err = c.(*net.TCPConn).SetWriteBuffer(4 << 10)
		} else {
			err = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		}
		return c, err
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// sparseFile makes a sparse file of size bytes in the workspace and
// returns its host path.
func (f *fixture) sparseFile(t *testing.T, name string, size int64) string {
	t.Helper()
	if err := os.MkdirAll(f.workspace(), 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.workspace(), name)
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fixture) workspace() string { return filepath.Join(f.areas, f.agent, "workspace") }

// TestUploadsStreamWithBoundedHeap: 24 uploads of 60 MiB, all in flight at
// once, must not grow the heap by more than 64 MiB (read whole, they grew it
// by about 3 GiB).
func TestUploadsStreamWithBoundedHeap(t *testing.T) {
	const (
		uploads = 24
		size    = 60 << 20
		bound   = 64 << 20
	)
	// One namespace may take three quarters of the slots.
	f := newFixture(t, Config{MaxBodyBytes: 64 << 20, MaxUploads: uploads + uploads/3})
	// Warm up: the first request builds the TLS session, the client and the
	// server's per-connection state; measure from there.
	if code, msg := f.put(context.Background(), "workspace/warm", strings.NewReader("x"), 1); code != http.StatusNoContent {
		t.Fatalf("warm-up upload: %d %s", code, msg)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse

	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			for cur := ms.HeapInuse; cur > peak.Load(); {
				peak.Store(cur)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	// Every body waits at its first read until all have started, so all 24
	// are in flight together.
	var started sync.WaitGroup
	started.Add(uploads)
	open := make(chan struct{})
	go func() {
		started.Wait()
		close(open)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	codes := make([]int, uploads)
	msgs := make([]string, uploads)
	for i := range uploads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := &gatedBody{r: io.LimitReader(&pattern{}, size), started: started.Done, open: open}
			codes[i], msgs[i] = f.put(ctx, fmt.Sprintf("workspace/up-%02d", i), body, size)
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled

	for i, c := range codes {
		if c != http.StatusNoContent {
			t.Errorf("upload %d: %d %s", i, c, msgs[i])
		}
	}
	growth := int64(peak.Load()) - int64(base)
	t.Logf("heap in use: %d MiB before, peak %d MiB, growth %d MiB for %d uploads of %d MiB", base>>20, peak.Load()>>20, growth>>20, uploads, size>>20)
	if growth > bound {
		t.Errorf("heap grew by %d MiB during %d concurrent uploads of %d MiB; the bound is %d MiB", growth>>20, uploads, size>>20, bound>>20)
	}
	for i := range uploads {
		fi, err := os.Stat(filepath.Join(f.workspace(), fmt.Sprintf("up-%02d", i)))
		if err != nil || fi.Size() != size {
			t.Fatalf("upload %d landed as %v, %v", i, fi, err)
		}
	}
	got, err := os.Open(filepath.Join(f.workspace(), "up-07"))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	h1, h2 := sha256.New(), sha256.New()
	_, _ = io.Copy(h1, got)
	_, _ = io.Copy(h2, io.LimitReader(&pattern{}, size))
	if string(h1.Sum(nil)) != string(h2.Sum(nil)) {
		t.Fatal("an uploaded file does not hold what was sent")
	}
	assertNoUploadTemps(t, f.workspace())
}

func assertNoUploadTemps(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".areas-write-") {
			t.Errorf("a temporary upload file was left behind: %s", p)
		}
		return nil
	})
}

func TestUploadSizeLimit(t *testing.T) {
	const limit = 1 << 20
	cases := []struct {
		name string
		// length is the Content-Length sent; -1 is a chunked body.
		length, sent int64
		code         int
	}{
		{"declared length over the limit", limit + 1, limit + 1, http.StatusRequestEntityTooLarge},
		{"chunked body over the limit", -1, 4 * limit, http.StatusRequestEntityTooLarge},
		{"chunked body at the limit", -1, limit, http.StatusNoContent},
		{"declared length at the limit", limit, limit, http.StatusNoContent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, Config{MaxBodyBytes: limit})
			old := []byte("the file before")
			if err := os.MkdirAll(f.workspace(), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(f.workspace(), "target"), old, 0o644); err != nil {
				t.Fatal(err)
			}
			before := f.refusals(refusalBodyTooLarge)
			code, msg := f.put(context.Background(), "workspace/target", io.LimitReader(&pattern{}, c.sent), c.length)
			if code != c.code {
				t.Fatalf("got %d %s, want %d", code, msg, c.code)
			}
			b, _ := os.ReadFile(filepath.Join(f.workspace(), "target"))
			if c.code == http.StatusRequestEntityTooLarge {
				if !strings.Contains(msg, "larger than the 1048576-byte limit of one upload") {
					t.Errorf("message %q does not name the limit", msg)
				}
				if string(b) != string(old) {
					t.Errorf("a refused upload changed the file: %d bytes", len(b))
				}
				if got := f.refusals(refusalBodyTooLarge); got != before+1 {
					t.Errorf("refusals{reason=%s}: got %v, want %v", refusalBodyTooLarge, got, before+1)
				}
			} else if int64(len(b)) != c.sent {
				t.Errorf("the file holds %d bytes, want %d", len(b), c.sent)
			}
			assertNoUploadTemps(t, f.workspace())
		})
	}
}

func TestUploadConcurrencyLimit(t *testing.T) {
	f := newFixture(t, Config{MaxUploads: 1})
	pr, pw := io.Pipe()
	// Runs before the server closes, which waits for this upload's body.
	t.Cleanup(func() { pw.Close() })
	first := make(chan int, 1)
	go func() {
		code, _ := f.put(context.Background(), "workspace/slow", pr, -1)
		first <- code
	}()
	if _, err := pw.Write([]byte("part of the body")); err != nil {
		t.Fatal(err)
	}
	// The first upload holds the only slot once its temporary file exists.
	testenv.Eventually(t, 30*time.Second, "the first upload started writing", func() bool { return hasUploadTemp(f.workspace()) })
	before := f.refusals(refusalTooManyUploads)
	code, msg := f.put(context.Background(), "workspace/second", strings.NewReader("x"), 1)
	if code != http.StatusTooManyRequests || !strings.Contains(msg, "1 uploads are in progress, the most this controller receives at once (--api-max-uploads)") {
		t.Fatalf("second upload: got %d %s, want 429 naming the limit", code, msg)
	}
	if got := f.refusals(refusalTooManyUploads); got != before+1 {
		t.Errorf("refusals{reason=%s}: got %v, want %v", refusalTooManyUploads, got, before+1)
	}
	if _, err := os.Stat(filepath.Join(f.workspace(), "second")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused upload wrote its file: %v", err)
	}
	pw.Close()
	if code := <-first; code != http.StatusNoContent {
		t.Fatalf("first upload: %d", code)
	}
	// The slot is free again.
	if code, msg := f.put(context.Background(), "workspace/third", strings.NewReader("x"), 1); code != http.StatusNoContent {
		t.Fatalf("upload after the first finished: %d %s", code, msg)
	}
}

func hasUploadTemp(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".areas-write-") {
			return true
		}
	}
	return false
}

func TestUploadBelongsToTheAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (giving a file to another user)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	root, err := areas.OpenRoot("/workspace", dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := receiveFile(root, "mine", strings.NewReader("agent data"), 0o600, runtimes.Identity{UID: 2000000001, GID: 2000000002}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "mine"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 2000000001 || st.Gid != 2000000002 || st.Mode&0o777 != 0o600 {
		t.Fatalf("uploaded file: owner %d:%d mode %o, want 2000000001:2000000002 0600", st.Uid, st.Gid, st.Mode&0o777)
	}
}

// Slots are held for as long as a body takes to arrive: a tenant that
// sends its bodies a byte a minute could hold them all and refuse every
// other tenant's uploads. One namespace takes at most three quarters.
func TestUploadSlotsAreShared(t *testing.T) {
	f := newFixture(t, Config{MaxUploads: 4})
	var stalled []*io.PipeWriter
	t.Cleanup(func() {
		for _, pw := range stalled {
			pw.Close()
		}
	})
	done := make(chan int, 4)
	for i := range 3 {
		pr, pw := io.Pipe()
		stalled = append(stalled, pw)
		go func() {
			code, _ := f.put(context.Background(), fmt.Sprintf("workspace/stalled-%d", i), pr, -1)
			done <- code
		}()
		if _, err := pw.Write([]byte("a byte a minute")); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "three stalled uploads hold their slots", func() bool {
		entries, _ := os.ReadDir(f.workspace())
		n := 0
		for _, e := range entries {
			if strings.Contains(e.Name(), ".areas-write-") {
				n++
			}
		}
		return n == 3
	})
	code, msg := f.put(context.Background(), "workspace/fourth", strings.NewReader("x"), 1)
	if code != http.StatusTooManyRequests || !strings.Contains(msg, "namespace team has 3 uploads in progress") {
		t.Fatalf("a fourth upload of the same namespace: %d %s; want 429 naming the namespace's share", code, msg)
	}
	if code, msg := f.putTo(context.Background(), "carol-token", otherNS, "o1", "workspace/theirs", strings.NewReader("x"), 1); code != http.StatusNoContent {
		t.Fatalf("another namespace's upload while the first holds its share: %d %s", code, msg)
	}
	for _, pw := range stalled {
		pw.Close()
	}
	for range 3 {
		if code := <-done; code != http.StatusNoContent {
			t.Fatalf("a stalled upload, once its body ended: %d", code)
		}
	}
}

// openCount is how many descriptors of this process have path open.
func openCount(t *testing.T, path string) int {
	t.Helper()
	return testenv.OpenDescriptors(t, func(target string) bool { return target == path })
}

// A client that stops reading a download is taken as gone once a write
// has waited its timeout, as an exec stream's client is: before, it held
// the agent's open file, its connection and a goroutine for as long as it
// liked.
func TestAStalledDownloadLetsGoOfTheFile(t *testing.T) {
	f := newFixture(t, Config{})
	f.api.downloadWriteTimeout = time.Second
	big := f.sparseFile(t, "big", 256<<20)
	// A client with a small receive buffer that reads the headers and
	// nothing more.
	tr := f.smallBuffers(t, false)
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/workspace/big", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer alice-token")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET of a file: %d", resp.StatusCode)
	}
	if openCount(t, big) == 0 {
		t.Fatal("the download does not hold the file open while it sends it")
	}
	testenv.Eventually(t, time.Minute, "the stalled download lets go of the file", func() bool {
		return openCount(t, big) == 0
	})
}

// TestAListingIsAnsweredAnEntryAtATime lists a directory of 20,000 names of
// 200 control bytes each: its JSON is some 27 MB, six bytes a name's byte,
// and it was built whole in memory (twice over as its buffer grew) for
// every listing asked for at once. Now it is written an entry at a time,
// and what the server allocates is far less than what it answers.
func TestAListingIsAnsweredAnEntryAtATime(t *testing.T) {
	f := newFixture(t, Config{})
	dir := filepath.Join(f.workspace(), "many")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	for i := range n {
		name := strings.Repeat("\x01", 192) + fmt.Sprintf("%08d", i)
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	get := func() (int64, uint64) {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/workspace/many", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice-token")
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		before := m.TotalAlloc
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET of the directory: %d", resp.StatusCode)
		}
		// Counted without keeping it: the client's share stays small.
		got, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&m)
		return got, m.TotalAlloc - before
	}
	answered, grew := get()
	if answered < n*192*6 {
		t.Fatalf("the listing answered %d bytes, less than its %d names of 192 escaped control bytes", answered, n)
	}
	// The listing itself (names, stats) is about half of the answer; built
	// whole, the answer allocated more than twice itself.
	if grew > uint64(answered)/1 {
		t.Fatalf("a listing of %d bytes allocated %d MiB on the way", answered, grew>>20)
	}
	// And it is still one JSON array of every entry.
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/workspace/many", nil)
	req.Header.Set("Authorization", "Bearer alice-token")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var entries []areas.Entry
	if err := json.NewDecoder(resp.Body).Decode(&entries); err != nil || len(entries) != n {
		t.Fatalf("the listing decodes to %d entries, %v; want %d", len(entries), err, n)
	}
}

// Downloads a client reads slowly, or not at all until the write deadline,
// each hold an open file, a descriptor and a goroutine: one namespace may
// have three quarters of --api-max-downloads at once, and the rest is
// refused with 429 until one ends.
func TestDownloadSlotsAreBounded(t *testing.T) {
	f := newFixture(t, Config{MaxDownloads: 4})
	f.sparseFile(t, "big", 256<<20)
	tr := f.smallBuffers(t, false)
	get := func(c *http.Client, p string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/"+p, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer alice-token")
		return c.Do(req)
	}
	var stalled []io.Closer
	for range 3 {
		resp, err := get(&http.Client{Transport: tr}, "workspace/big")
		if err != nil {
			t.Fatal(err)
		}
		// Closed below, once the refusals are seen; this is for a failure.
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a download within the namespace's share: %d", resp.StatusCode)
		}
		stalled = append(stalled, resp.Body)
	}
	before := f.refusals(refusalTooManyDownloads)
	for _, p := range []string{"workspace/big", "workspace"} {
		resp, err := get(f.srv.Client(), p)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(msg), "--api-max-downloads") {
			t.Fatalf("GET of %s while the namespace's 3 downloads are stalled: %d %s, want 429 naming --api-max-downloads", p, resp.StatusCode, msg)
		}
	}
	if got := f.refusals(refusalTooManyDownloads); got != before+2 {
		t.Errorf("refusals{reason=%s}: got %v, want %v", refusalTooManyDownloads, got, before+2)
	}
	for _, body := range stalled {
		body.Close()
	}
	testenv.Eventually(t, 30*time.Second, "a download is answered once the stalled ones ended", func() bool {
		resp, err := get(f.srv.Client(), "workspace")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	})
}

// A listing holds a batch of its directory at a time, not the directory:
// four listings of 40,000 names of 200 bytes, whose clients stop reading,
// hold the server's heap by a few batches; read whole first, each held
// about 11 MB until its client went.
func TestAStalledListingHoldsABatchNotTheDirectory(t *testing.T) {
	f := newFixture(t, Config{})
	dir := filepath.Join(f.workspace(), "crowd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n, listings = 40000, 4
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%08d", i)+strings.Repeat("n", 192)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tr := f.smallBuffers(t, false)
	c := &http.Client{Transport: tr}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base := m.HeapAlloc
	for range listings {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/api/v1alpha1/namespaces/"+ns+"/sessionclaims/s1/files/workspace/crowd", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice-token")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// The headers and nothing more: the answer waits on its client.
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET of the directory: %d", resp.StatusCode)
		}
	}
	// Until the server's writes have filled the sockets and block.
	time.Sleep(time.Second)
	runtime.GC()
	runtime.ReadMemStats(&m)
	held := int64(m.HeapAlloc) - int64(base)
	t.Logf("%d stalled listings of %d names hold %.1f MiB", listings, n, float64(held)/(1<<20))
	if held > 8<<20 {
		t.Fatalf("%d stalled listings of %d names hold %d MiB of the heap", listings, n, held>>20)
	}
}
