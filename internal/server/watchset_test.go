package server

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// The events that matter and those that do not, for a plain file, a Kubernetes volume and a
// folder.
func TestWatchSetMatters(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "config.yaml"), "x")

	// A Secret volume: key.pem -> ..data/key.pem, ..data -> ..2025_001.
	mount := t.TempDir()
	if err := os.Mkdir(filepath.Join(mount, "..2025_001"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mount, "..2025_001", "key.pem"), "k")
	symlink(t, "..2025_001", filepath.Join(mount, "..data"))
	symlink(t, filepath.Join("..data", "key.pem"), filepath.Join(mount, "key.pem"))

	rules := t.TempDir()

	s := newWatchSet()
	s.addFile(filepath.Join(dir, "config.yaml"))
	s.addFile(filepath.Join(mount, "key.pem"))
	s.addFile(filepath.Join(dir, "missing.pem")) // named by the config, not there yet
	s.addFolder(rules)

	if want := []string{dir, mount, rules}; !slices.Equal(s.dirs, want) {
		t.Errorf("dirs got %q, want %q", s.dirs, want)
	}
	for name, want := range map[string]bool{
		filepath.Join(dir, "config.yaml"):       true,
		filepath.Join(dir, "missing.pem"):       true, // its Create must reload
		filepath.Join(dir, "gateway.log"):       false,
		filepath.Join(dir, ".config.yaml.swp"):  false,
		filepath.Join(dir, "config.yaml.tmp"):   false, // the rename's Create of config.yaml follows
		dir:                                     true,  // the watched directory itself went away
		filepath.Join(mount, "key.pem"):         true,
		filepath.Join(mount, "..data"):          true, // the swap
		filepath.Join(mount, "..data_tmp"):      false,
		filepath.Join(mount, "..2025_002"):      false, // the next version, written before the swap
		filepath.Join(mount, "other.pem"):       false,
		filepath.Join(rules, "a.yaml"):          true,
		filepath.Join(rules, "sub", "b.yaml"):   false, // only entries directly inside
		filepath.Join(t.TempDir(), "elsewhere"): false,
	} {
		if got := s.matters(name); got != want {
			t.Errorf("matters(%s) got %v, want %v", name, got, want)
		}
	}
}

// Relative paths resolve against the working directory, as policy opens them, and `key.pem` and
// `./key.pem` are one file.
func TestWatchSetRelativePaths(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	s := newWatchSet()
	s.addFile("key.pem")
	s.addFile("./key.pem")
	if want := []string{dir}; !slices.Equal(s.dirs, want) {
		t.Errorf("dirs got %q, want %q", s.dirs, want)
	}
	if !s.matters(filepath.Join(dir, "key.pem")) || len(s.names) != 1 {
		t.Errorf("names got %v, want only %s", s.names, filepath.Join(dir, "key.pem"))
	}
}

// A symlink loop ends after maxLinkHops.
func TestWatchSetSymlinkLoop(t *testing.T) {
	dir := t.TempDir()
	symlink(t, "b", filepath.Join(dir, "a"))
	symlink(t, "a", filepath.Join(dir, "b"))
	s := newWatchSet()
	s.addFile(filepath.Join(dir, "a"))
	if !s.matters(filepath.Join(dir, "a")) || !s.matters(filepath.Join(dir, "b")) || s.matters(filepath.Join(dir, "c")) {
		t.Errorf("names got %v, want a and b", s.names)
	}
}
