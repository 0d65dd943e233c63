#include "serve/api_key.h"

#include <cctype>

namespace specloop {

bool BearerTokenMatches(const std::string& authorization, const std::string& key) {
  static const std::string kScheme = "bearer ";
  if (key.empty() || authorization.size() < kScheme.size()) return false;
  unsigned diff = authorization.size() != kScheme.size() + key.size() ? 1 : 0;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    diff |= static_cast<unsigned>(std::tolower(static_cast<unsigned char>(authorization[i])) ^
                                  kScheme[i]);
  }
  // Every byte of the key is compared, whatever the header's length.
  for (size_t i = 0; i < key.size(); ++i) {
    const size_t j = kScheme.size() + i;
    const unsigned char given = j < authorization.size() ? authorization[j] : 0;
    diff |= static_cast<unsigned>(given ^ static_cast<unsigned char>(key[i]));
  }
  return diff == 0;
}

}  // namespace specloop
