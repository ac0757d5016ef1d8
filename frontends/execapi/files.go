package execapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"syscall"
	"time"

	"github.com/cireilclaw/sandbox-controller/internal/areas"
	"github.com/cireilclaw/sandbox-controller/runtimes"
)

// Headers of file responses.
const (
	headerEntryType = "X-Entry-Type"
	headerFileMode  = "X-File-Mode"
)

// serveFiles reads, lists, writes and deletes files of a claim's areas and
// mounts, every access contained by internal/areas.
func (s *Server) serveFiles(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	verb := "get"
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPut, http.MethodDelete:
		verb = "update"
	default:
		writeStatus(w, &apiError{code: http.StatusMethodNotAllowed, msg: "files take GET, HEAD, PUT or DELETE"})
		return
	}
	u, how := s.authenticate(w, r)
	if u == nil || !s.authorize(w, r, u, verb, subresourceFiles, ns, name) {
		return
	}
	area := r.PathValue("area")
	if !isArea(area) {
		s.refuse(w, r, u, &apiError{code: http.StatusNotFound, msg: fmt.Sprintf("no area %q: the areas are workspace, memories, blocks, skills and tasks; custom mounts are below workspace/", area)})
		return
	}
	sandboxPath := path.Join("/", area, r.PathValue("path"))
	t, ok := s.claimTarget(w, r, u, how, ns, name, false)
	if !ok {
		return
	}
	v, err := t.instance.FileView()
	if err != nil {
		s.log.Info("opening a claim's areas failed", "claim", ns+"/"+name, "error", err.Error())
		s.refuse(w, r, u, &apiError{code: http.StatusServiceUnavailable, msg: errAreasUnavailable(ns+"/"+name, err).Error()})
		return
	}
	root, rel, err := v.Resolve(sandboxPath)
	if err != nil {
		s.refuse(w, r, u, s.fileError(ns+"/"+name, sandboxPath, err))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		err = s.readFile(w, r, root, rel)
	case http.MethodPut:
		err = s.writeFile(w, r, root, rel, t.instance.Identity)
	case http.MethodDelete:
		err = removeFile(w, r, v, sandboxPath)
	}
	if err != nil {
		var aerr *apiError
		if !errors.As(err, &aerr) {
			aerr = s.fileError(ns+"/"+name, sandboxPath, err)
		}
		s.refuse(w, r, u, aerr)
	}
}

// errAreasUnavailable says a claim's areas could not be opened, in words
// that name no host path (the node's areas root and layout are not the
// caller's to learn); the controller's log has the cause.
func errAreasUnavailable(claim string, err error) error {
	why := "the controller's log on the node has the cause"
	if errors.Is(err, fs.ErrNotExist) {
		why = "a place is missing: an overlay or a sized area exists while the Sandbox's instance runs; the controller's log on the node has the cause"
	}
	return fmt.Errorf("the areas of SessionClaim %s cannot be opened now (%s)", claim, why)
}

func isArea(name string) bool {
	for _, a := range runtimes.StandardAreas {
		if a.Name == name {
			return true
		}
	}
	return false
}

// readFile answers a file's contents (ranges allowed) or a directory's
// entries as JSON; HEAD answers the headers alone. A GET holds one of the
// namespace's download slots while it is answered.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request, root *areas.Root, rel string) error {
	e, err := root.Stat(rel)
	if err != nil {
		return err
	}
	if !e.IsDir() && e.Type != areas.TypeFile {
		return &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("%s is a %s, not a regular file or directory", rel, e.Type)}
	}
	if r.Method != http.MethodHead {
		ns := r.PathValue("namespace")
		if aerr := s.takeDownload(w, ns); aerr != nil {
			return aerr
		}
		defer s.downloads.release(ns)
	}
	w.Header().Set(headerEntryType, string(e.Type))
	w.Header().Set(headerFileMode, fmt.Sprintf("%04o", e.Mode.Perm()))
	out := deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: s.downloadWriteTimeout}
	if e.IsDir() {
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Type", "application/json")
			return nil
		}
		return writeEntries(out, root, rel)
	}
	f, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	// ServeContent streams from the open descriptor: the size, ranges and
	// conditional requests are answered without reading the file into memory.
	http.ServeContent(out, r, "", e.ModTime, f)
	return nil
}

// writeEntries answers the listing of directory rel as one JSON array, in
// the directory's order, an entry at a time through a buffer, as
// root.Each reads them: the names are the agent's, up to 255 bytes each,
// and a control byte is six in JSON, so a listing held whole, or its
// answer, would be many times what one batch is (about 160 MB of answer
// for 100,000 such names), for every listing asked for at once. A
// directory of too many entries is refused before anything is written;
// a failure once the answer has begun aborts it, which the client sees
// as a broken answer, never as a shorter listing.
func writeEntries(w http.ResponseWriter, root *areas.Root, rel string) error {
	var bw *bufio.Writer
	var enc *json.Encoder
	sep := byte('[')
	err := root.Each(rel, areas.MaxListEntries, func(batch []areas.Entry) error {
		if bw == nil {
			w.Header().Set("Content-Type", "application/json")
			bw = bufio.NewWriterSize(w, 32<<10)
			enc = json.NewEncoder(bw)
		}
		for i := range batch {
			if err := bw.WriteByte(sep); err != nil {
				return err
			}
			// Encode reuses its buffer from one entry to the next; the
			// line it ends each with is JSON's whitespace.
			if err := enc.Encode(&batch[i]); err != nil {
				return err
			}
			sep = ','
		}
		return nil
	})
	switch {
	case err != nil && bw == nil:
		return err
	case err != nil:
		panic(http.ErrAbortHandler)
	case bw == nil:
		w.Header().Set("Content-Type", "application/json")
		_, err = io.WriteString(w, "[]\n")
		return err
	}
	if _, err := bw.WriteString("]\n"); err != nil {
		panic(http.ErrAbortHandler)
	}
	if err := bw.Flush(); err != nil {
		panic(http.ErrAbortHandler)
	}
	return nil
}

// deadlineWriter gives each write of a response d to leave. A client that
// stops reading is then taken as gone, as an exec stream's is; before, it
// held the agent's open file, its connection and a goroutine for as long
// as it liked, as many times as it liked.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(p)
}

// Unwrap gives http.ResponseController the writer beneath.
func (w deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeFile replaces a file atomically with the request body, or makes a
// directory with ?directory=true.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, root *areas.Root, rel string, owner runtimes.Identity) error {
	q := r.URL.Query()
	if dir, _ := strconv.ParseBool(q.Get("directory")); dir {
		if err := root.Mkdir(rel, true); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	perm := os.FileMode(0o644)
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o777 {
			return &apiError{code: http.StatusBadRequest, refusal: refusalBadRequest, msg: fmt.Sprintf("mode=%q is not an octal permission such as 0644", m)}
		}
		perm = os.FileMode(v)
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return tooLarge(s.cfg.MaxBodyBytes)
	}
	ns := r.PathValue("namespace")
	if aerr := s.takeUpload(w, ns); aerr != nil {
		return aerr
	}
	defer s.uploads.release(ns)
	if err := receiveFile(root, rel, http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), perm, owner); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(s.cfg.MaxBodyBytes)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// takeUpload takes an upload slot for namespace ns (release it with
// s.uploads.release), or says why none is free.
func (s *Server) takeUpload(w http.ResponseWriter, ns string) *apiError {
	return takeSlot(w, s.uploads, ns, refusalTooManyUploads, "uploads", "receives", "--api-max-uploads", s.cfg.MaxUploads)
}

// takeDownload takes a download slot for namespace ns (release it with
// s.downloads.release), or says why none is free.
func (s *Server) takeDownload(w http.ResponseWriter, ns string) *apiError {
	return takeSlot(w, s.downloads, ns, refusalTooManyDownloads, "downloads and listings", "answers", "--api-max-downloads", s.cfg.MaxDownloads)
}

func takeSlot(w http.ResponseWriter, slots *uploadSlots, ns, refusal, what, verb, flag string, n int) *apiError {
	ok, byNS := slots.tryAcquire(ns)
	if ok {
		return nil
	}
	w.Header().Set("Retry-After", "1")
	if byNS {
		return &apiError{code: http.StatusTooManyRequests, refusal: refusal, msg: fmt.Sprintf("namespace %s has %d %s in progress, the most one namespace may have at once on this node (%s less a quarter kept for other namespaces); retry later", ns, slots.share, what, flag)}
	}
	return &apiError{code: http.StatusTooManyRequests, refusal: refusal, msg: fmt.Sprintf("%d %s are in progress, the most this controller %s at once (%s); retry later", n, what, verb, flag)}
}

// receiveFile streams body into a temporary file beside rel, opened beneath
// the root, and renames it into place once the body is complete: memory per
// upload is one copy buffer whatever the size, and a failed or refused
// upload leaves the old file as it was. A new file belongs to owner (the
// agent's identity) when that is not root, given through the descriptor.
func receiveFile(root *areas.Root, rel string, body io.Reader, perm os.FileMode, owner runtimes.Identity) error {
	st, err := root.Stage(rel, perm, false)
	if err != nil {
		return err
	}
	defer st.Abort()
	if owner.UID != 0 || owner.GID != 0 {
		if err := st.Chown(int(owner.UID), int(owner.GID)); err != nil {
			return err
		}
	}
	src := &bodyReader{r: body}
	if _, err := io.Copy(st, src); err != nil {
		var mbe *http.MaxBytesError
		if src.err == nil || errors.As(err, &mbe) {
			return err
		}
		return &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("receiving %s: %v", rel, err)}
	}
	return st.Commit()
}

// bodyReader remembers a read error, so that a client that broke off its
// body is told apart from a write that failed on the host.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func tooLarge(limit int64) *apiError {
	return &apiError{code: http.StatusRequestEntityTooLarge, refusal: refusalBodyTooLarge, msg: fmt.Sprintf("the body is larger than the %d-byte limit of one upload", limit)}
}

// removeFile deletes a file, or a directory tree with ?recursive=true. A
// directory that is or holds the mount point of a custom mount is refused
// (409), whatever links its path goes through.
func removeFile(w http.ResponseWriter, r *http.Request, v *areas.View, sandboxPath string) error {
	recursive, _ := strconv.ParseBool(r.URL.Query().Get("recursive"))
	if err := v.Remove(sandboxPath, recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fileError maps an areas error of a request of claim for path p to the
// answer: escapes and read-only roots are refusals (403), counted; what
// is no fault of the caller's is told by hideFailure (500).
func (s *Server) fileError(claim, p string, err error) *apiError {
	switch {
	case errors.Is(err, areas.ErrEscape):
		return &apiError{code: http.StatusForbidden, refusal: refusalEscape, msg: err.Error()}
	case errors.Is(err, areas.ErrMountPoint):
		return &apiError{code: http.StatusConflict, refusal: refusalMountPoint, msg: err.Error()}
	case errors.Is(err, syscall.EBUSY):
		// A mount point the agent moved elsewhere in its workspace: the
		// kernel refuses to remove it in the controller's namespace.
		return &apiError{code: http.StatusConflict, refusal: refusalMountPoint, msg: fmt.Sprintf("%s: it is or holds a mount point of the sandbox: %v", p, err)}
	case errors.Is(err, areas.ErrReadOnly):
		return &apiError{code: http.StatusForbidden, refusal: refusalReadOnly, msg: fmt.Sprintf("%s: %v", p, err)}
	case errors.Is(err, fs.ErrNotExist):
		return &apiError{code: http.StatusNotFound, msg: fmt.Sprintf("%s: %v", p, err)}
	case errors.Is(err, areas.ErrInvalidPath), errors.Is(err, areas.ErrNoRoot),
		errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY),
		// A name too long or a loop of links is the path the caller
		// chose, not a fault of the server.
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP), errors.Is(err, areas.ErrTooDeep),
		errors.Is(err, areas.ErrTooManyEntries):
		return &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf("%s: %v", p, err)}
	default:
		return &apiError{code: http.StatusInternalServerError, msg: s.hideFailure("the file request for "+p, claim, err)}
	}
}
