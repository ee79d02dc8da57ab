//go:build exactmutant

package server

import (
	"os"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/exactmutant"
)

// A gateway built with the exactmutant tag is the self-test's mutant named in
// RATELIMIT_EXACT_MUTANT (make check-exact's self-test; never a production build).

func mutateClient(api dynamo.API) dynamo.API {
	return exactmutant.Client(api, os.Getenv(exactmutant.Env))
}

func mutateStore(s bucket.Store) bucket.Store {
	return exactmutant.Store(s, os.Getenv(exactmutant.Env))
}
