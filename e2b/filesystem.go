package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/sandboxd/sandboxd/e2b/envdpb/filesystem"
	"github.com/sandboxd/sandboxd/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/workspace"
)

// filesystemService is envd's Filesystem service over a sandbox's
// workspace files, through the session's FileSystem and the write guard
// every tool is under.
type filesystemService struct{ s *Server }

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// workspaceName is E2B path p as a workspace name: a relative path is taken
// from the home directory, which is the workspace root, as an absolute one
// under it (or under the workspace root's real path) is. inside is false for
// an absolute path elsewhere.
func workspaceName(b *sandbox, p string) (name string, inside bool) {
	if !path.IsAbs(p) {
		return clean(p), true
	}
	p = path.Clean(p)
	for _, root := range []string{Home, b.sess.Root()} {
		if p == root {
			return "", true
		}
		if rest, ok := strings.CutPrefix(p, root+"/"); ok {
			return rest, true
		}
	}
	return "", false
}

func clean(p string) string {
	if c := path.Clean(p); c != "." {
		return c
	}
	return ""
}

// e2bPath is a workspace name as E2B shows it.
func e2bPath(name string) string { return path.Join(Home, name) }

// fsName is a request's path as a workspace name, or an error naming it.
func fsName(b *sandbox, p string) (string, error) {
	name, inside := workspaceName(b, p)
	if !inside {
		return "", connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: %v: this server's sandboxes reach their workspace only, %s (the home directory)", p, workspace.ErrOutsideWorkspace, Home))
	}
	return name, nil
}

// dotted is a workspace name as the FileSystem port takes the root.
func dotted(name string) string {
	if name == "" {
		return "."
	}
	return name
}

// files is the sandbox's FileSystem under the write guard.
func files(b *sandbox) workspace.FileSystem {
	return workspace.Guard(b.sess.FS(), b.sess.Root(), b.sess.Tools().Config().Protect)
}

// changing is files(b) for a call that changes them, once the session's
// first tree is read (runner.Session.BeforeChange): its diff then sees the
// change as the session's.
func changing(ctx context.Context, b *sandbox) (workspace.FileSystem, error) {
	if err := b.sess.BeforeChange(ctx); err != nil {
		return nil, err
	}
	return files(b), nil
}

// rpcError is a FileSystem error as a Connect error, its kind as the code
// the SDK reads (not_found is its NotFoundException).
func rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch workspace.KindOf(err) {
	case workspace.ErrNotFound:
		code = connect.CodeNotFound
	case workspace.ErrExists:
		code = connect.CodeAlreadyExists
	case workspace.ErrOutsideWorkspace, workspace.ErrProtected, workspace.ErrForbidden:
		code = connect.CodePermissionDenied
	case workspace.ErrNotAFile, workspace.ErrNotADirectory, workspace.ErrNotEmpty, workspace.ErrInvalidArgument:
		code = connect.CodeInvalidArgument
	case workspace.ErrFileTooLarge:
		code = connect.CodeResourceExhausted
	case workspace.ErrTimeout:
		code = connect.CodeDeadlineExceeded
	case workspace.ErrUnavailable:
		code = connect.CodeUnavailable
	}
	if errors.Is(err, context.Canceled) {
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}

// entry describes name, following a link to say what it leads to.
func entry(ctx context.Context, fsys workspace.FileSystem, name string) (*pb.EntryInfo, error) {
	fi, err := fsys.Lstat(ctx, dotted(name))
	if err != nil {
		return nil, err
	}
	e := info(name, fi)
	if fi.Mode()&fs.ModeSymlink != 0 {
		if sl, ok := fsys.(workspace.SymlinkFS); ok {
			if target, err := sl.Readlink(ctx, name); err == nil {
				if !path.IsAbs(target) {
					target = e2bPath(path.Join(path.Dir(name), target))
				}
				e.SymlinkTarget = &target
			}
		}
		if ti, err := fsys.Stat(ctx, name); err == nil {
			e.Type = fileType(ti.Mode())
		}
	}
	return e, nil
}

func fileType(m fs.FileMode) pb.FileType {
	if m.IsDir() {
		return pb.FileType_FILE_TYPE_DIRECTORY
	}
	return pb.FileType_FILE_TYPE_FILE
}

// info is an EntryInfo of a workspace name. Every file of a sandbox is its
// one user's, "user" as E2B names it.
func info(name string, fi fs.FileInfo) *pb.EntryInfo {
	base := path.Base(e2bPath(name))
	return &pb.EntryInfo{
		Name: base, Type: fileType(fi.Mode()), Path: e2bPath(name), Size: fi.Size(),
		Mode: uint32(fi.Mode().Perm()), Permissions: fi.Mode().String(), Owner: "user", Group: "user",
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
}

func (svc *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	b := boxOf(ctx)
	name, err := fsName(b, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	e, err := entry(ctx, files(b), name)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (svc *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	b := boxOf(ctx)
	name, err := fsName(b, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	fsys, err := changing(ctx, b)
	if err != nil {
		return nil, rpcError(err)
	}
	if _, err := fsys.Lstat(ctx, dotted(name)); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s: %v", req.Msg.Path, workspace.ErrExists))
	}
	if err := workspace.MkdirAll(ctx, fsys, name, 0o755); err != nil {
		return nil, rpcError(err)
	}
	e, err := entry(ctx, fsys, name)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

func (svc *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	b := boxOf(ctx)
	from, err := fsName(b, req.Msg.Source)
	if err != nil {
		return nil, err
	}
	to, err := fsName(b, req.Msg.Destination)
	if err != nil {
		return nil, err
	}
	fsys, err := changing(ctx, b)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := fsys.Rename(ctx, dotted(from), dotted(to)); err != nil {
		return nil, rpcError(err)
	}
	e, err := entry(ctx, fsys, to)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// dirOf is the sandbox's files and E2B path p as the workspace name of a
// directory, or an error naming why not.
func dirOf(ctx context.Context, b *sandbox, p string) (workspace.FileSystem, string, error) {
	name, err := fsName(b, p)
	if err != nil {
		return nil, "", err
	}
	fsys := files(b)
	fi, err := fsys.Stat(ctx, dotted(name))
	if err != nil {
		return nil, "", rpcError(err)
	}
	if !fi.IsDir() {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %v", p, workspace.ErrNotADirectory))
	}
	return fsys, name, nil
}

// maxListed bounds the entries one ListDir answers.
const maxListed = 100_000

func (svc *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	fsys, name, err := dirOf(ctx, boxOf(ctx), req.Msg.Path)
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.Depth), 1)
	res, err := workspace.Walk(ctx, fsys, workspace.WalkRequest{Dir: name, MaxDepth: depth, Info: true, Limit: maxListed})
	if err != nil {
		return nil, rpcError(err)
	}
	if res.Truncated {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s holds more than %d entries to depth %d: list less deep", req.Msg.Path, maxListed, depth))
	}
	out := make([]*pb.EntryInfo, 0, len(res.Entries))
	for _, we := range res.Entries {
		if we.Path == name || we.Path == "" || we.Path == "." {
			continue
		}
		e, err := entry(ctx, fsys, we.Path)
		if err != nil {
			continue // gone since the walk saw it
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *pb.EntryInfo) int { return strings.Compare(a.Path, b.Path) })
	return connect.NewResponse(&pb.ListDirResponse{Entries: out}), nil
}

func (svc *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	b := boxOf(ctx)
	name, err := fsName(b, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("the home directory is the workspace root: it is not removed"))
	}
	fsys, err := changing(ctx, b)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := workspace.RemoveAll(ctx, fsys, name); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// maxFile is the largest file a sandbox's /files reads or writes: its
// session's maxFileBytes, as for the tools.
func maxFile(b *sandbox) int64 { return b.sess.Tools().Config().MaxFileBytes }

// download answers GET /files: the file's bytes, up to the session's
// maxFileBytes.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	b := boxOf(r.Context())
	p := r.URL.Query().Get("path")
	name, inside := workspaceName(b, p)
	if !inside || name == "" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q: want a file in the workspace, %s", p, Home))
		return
	}
	data, err := files(b).ReadFile(r.Context(), name, maxFile(b))
	if err != nil {
		s.fileError(w, r, p, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(name)}))
	w.WriteHeader(http.StatusOK)
	w.Write(data)
}

// fileError answers a FileSystem error of /files as envd does.
func (s *Server) fileError(w http.ResponseWriter, r *http.Request, p string, err error) {
	status := http.StatusInternalServerError
	switch workspace.KindOf(err) {
	case workspace.ErrNotFound:
		status = http.StatusNotFound
	case workspace.ErrFileTooLarge:
		status = http.StatusRequestEntityTooLarge
	case workspace.ErrOutsideWorkspace, workspace.ErrProtected, workspace.ErrForbidden, workspace.ErrNotAFile,
		workspace.ErrNotADirectory, workspace.ErrInvalidArgument, workspace.ErrExists:
		status = http.StatusBadRequest
	case workspace.ErrUnavailable:
		status = http.StatusBadGateway
	}
	if status >= 500 {
		s.o.logger.Error("e2b file request failed", "method", r.Method, "path", p, "error", err)
	}
	writeError(w, status, err.Error())
}

// writeInfo is what upload answers per file.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload answers POST /files: each multipart part named "file" is written
// to the path query parameter (one file) or to its part's file name,
// parents made as needed; an octet-stream body is the one file at path.
// Every part is read whole and judged before anything is written.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	b := boxOf(r.Context())
	q := r.URL.Query().Get("path")
	limit := maxFile(b)
	r.Body = http.MaxBytesReader(w, r.Body, limit+(1<<20))
	type part struct {
		name string
		data []byte
	}
	var parts []part
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	target := func(p string) (string, bool) {
		name, inside := workspaceName(b, p)
		if !inside || name == "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q: want a file in the workspace, %s", p, Home))
			return "", false
		}
		return name, true
	}
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			pt, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				s.bodyError(w, err)
				return
			}
			if pt.FormName() != "file" {
				continue
			}
			p := cmpOr(q, pt.FileName())
			if len(parts) > 0 && q != "" {
				p = pt.FileName() // several files: each its own name
			}
			name, ok := target(p)
			if !ok {
				return
			}
			data, err := io.ReadAll(pt)
			if err != nil {
				s.bodyError(w, err)
				return
			}
			parts = append(parts, part{name, data})
		}
	} else {
		name, ok := target(q)
		if !ok {
			return
		}
		data, err := io.ReadAll(r.Body)
		if err != nil {
			s.bodyError(w, err)
			return
		}
		parts = append(parts, part{name, data})
	}
	fsys, err := changing(r.Context(), b)
	if err != nil {
		s.fileError(w, r, Home, err)
		return
	}
	out := []writeInfo{}
	for _, pt := range parts {
		if int64(len(pt.data)) > limit {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%s: %d bytes is over the %d a file may have (maxFileBytes, a tool option)", e2bPath(pt.name), len(pt.data), limit))
			return
		}
		if dir := path.Dir(pt.name); dir != "." {
			if err := workspace.MkdirAll(r.Context(), fsys, dir, 0o755); err != nil {
				s.fileError(w, r, e2bPath(dir), err)
				return
			}
		}
		if err := fsys.WriteFile(r.Context(), pt.name, pt.data, 0o644); err != nil {
			s.fileError(w, r, e2bPath(pt.name), err)
			return
		}
		out = append(out, writeInfo{Name: path.Base(pt.name), Type: "file", Path: e2bPath(pt.name)})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) bodyError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the upload is over %d bytes", mbe.Limit))
		return
	}
	writeError(w, http.StatusBadRequest, "reading the upload: "+err.Error())
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
