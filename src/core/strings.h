// Small string helpers shared by policy parsing, logging and the catalogue.
#ifndef TEFL_SRC_CORE_STRINGS_H_
#define TEFL_SRC_CORE_STRINGS_H_

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace tefl {

inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

inline std::string ToLower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Splits on `sep`, keeping empty pieces (callers decide what empty means).
inline std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

}  // namespace tefl

#endif  // TEFL_SRC_CORE_STRINGS_H_
