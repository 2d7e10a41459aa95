package loadgen

import "errors"

// ErrInvalidConfig is wrapped by every error of [Config.Validate] and of the
// parsers ([ParseDist], [ParseSLO], [ReadPrompts]).
var ErrInvalidConfig = errors.New("loadgen: invalid config")
