package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxLinkHops bounds how many symlinks watchSet follows from one file (the kernel allows 40;
// a Kubernetes volume uses two).
const maxLinkHops = 8

// watchSet is what the config watcher reacts to: the files the running config depends on, and
// folders whose every entry it depends on. fsnotify watches directories, so every event in them
// arrives; matters keeps those about a tracked file and drops the rest (a log file beside the
// config, an editor's swap file), which would otherwise wake the watcher, and a watcher that
// logs would then wake itself for ever.
//
// A tracked file is matched by its own directory entry, and by every entry of a watched
// directory that a symlink on its way points through: a Kubernetes ConfigMap or Secret volume
// holds `config.yaml -> ..data/config.yaml` and `..data -> ..2025_01_01_00_00_00.1`, and an
// update only swaps `..data` (a Create of `..data`), never touching the entry `config.yaml`.
// Links are read when the set is built (after each reload), which is when they can have
// changed: a swap of `..data` is itself an event that matters.
//
// A tracked folder (Reloader inputs that name a directory, such as a folder of rule files)
// matches every entry directly inside it, and the folder's own entry.
//
// The zero value is not usable; build one with newWatchSet. Not safe for concurrent use: the
// watcher builds a new one after each reload and only its own goroutine reads it.
type watchSet struct {
	dirs    []string            // the directories to watch, absolute, in the order first added
	names   map[string]struct{} // absolute entries that matter: tracked files and their symlinks' hops
	folders map[string]struct{} // absolute folders whose entries all matter
}

func newWatchSet() *watchSet {
	return &watchSet{names: make(map[string]struct{}), folders: make(map[string]struct{})}
}

// addDir watches dir (absolute) without tracking anything in it.
func (s *watchSet) addDir(dir string) {
	if !slices.Contains(s.dirs, dir) {
		s.dirs = append(s.dirs, dir)
	}
}

// addFile tracks path: its directory is watched, and its entry and the entries its symlinks
// lead through (see watchSet) matter. A relative path resolves against the working directory,
// as policy resolves the paths of the config.
func (s *watchSet) addFile(path string) {
	p := absPath(path)
	s.addDir(filepath.Dir(p))
	hops := []string{p}
	for range maxLinkHops {
		target, err := os.Readlink(p)
		if err != nil {
			break // not a symlink (or not there yet): the entry itself is all that matters
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = filepath.Clean(target)
		hops = append(hops, p)
	}
	for _, h := range hops {
		s.names[h] = struct{}{}
	}
}

// addFolder tracks dir: it is watched, and every entry directly inside it matters, as does its
// own entry (in its parent, when that is watched for another reason).
func (s *watchSet) addFolder(dir string) {
	d := absPath(dir)
	s.addDir(d)
	s.folders[d] = struct{}{}
	s.names[d] = struct{}{}
}

// matters reports whether an event about name (an absolute path, as fsnotify reports events in
// directories added by absolute path) concerns a tracked file or folder. An event about a
// watched directory itself (it was removed or moved away) matters too: the watch is gone, and
// only a resync after a reload can restore it.
func (s *watchSet) matters(name string) bool {
	if _, ok := s.names[name]; ok {
		return true
	}
	if _, ok := s.folders[filepath.Dir(name)]; ok {
		return true
	}
	// An ancestor of a tracked entry: a swap of `..data` changes what `..data/config.yaml`,
	// and so `config.yaml`, reads.
	prefix := name + string(filepath.Separator)
	for n := range s.names {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return slices.Contains(s.dirs, name)
}

// absPath makes path absolute against the working directory, cleaned; if that fails (the
// working directory is gone) it is only cleaned.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return filepath.Clean(path)
}
