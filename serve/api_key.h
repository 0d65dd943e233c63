// API keys for the HTTP API (`specloop serve --api-key`, or $SPECLOOP_API_KEY): the check of
// an Authorization header against the configured key. Pure; no HTTP library.
#pragma once

#include <string>

namespace specloop {

// True when `authorization` (an Authorization header value) is "Bearer <key>" (the scheme in
// any case, one space). An empty key never matches. The comparison takes the same time for
// every header of a given length, whatever bytes it holds (no early exit on a mismatch).
bool BearerTokenMatches(const std::string& authorization, const std::string& key);

}  // namespace specloop
