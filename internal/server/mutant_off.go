//go:build !exactmutant

package server

import (
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The production build has no mutants (see internal/exactmutant): the store is what it is.

func mutateClient(api dynamo.API) dynamo.API  { return api }
func mutateStore(s bucket.Store) bucket.Store { return s }
