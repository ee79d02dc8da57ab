package policy

import "github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"

// AlgorithmNames returns the values a policy's algorithm field accepts, in the order the docs list
// them. The JSON Schema of the configuration (internal/configschema) reads them from here, so a
// new algorithm reaches editors without a second list to keep in step.
func AlgorithmNames() []string { return limitterms.AlgorithmNames() }
