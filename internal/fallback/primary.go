package fallback

import "github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"

// Primary returns the store this Store guards: the operators' console inspects and resets keys
// there directly (a reset must reach the shared state, not a local fallback's).
func (s *Store) Primary() bucket.Store { return s.primary }
