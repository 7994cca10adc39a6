// A small JSON reader and writer for the bundle's manifest (cpp/core/bundle.cpp).
//
// Strict RFC 8259: one value, no comments, no trailing commas, \u escapes (surrogate pairs
// joined) written out as UTF-8; numbers are kept as their text so that a float field parses
// with strtof from the digits the writer printed (an exact round trip). Nesting deeper than
// kMaxDepth is refused. Errors are ModelError naming the byte offset and what was expected.
//
// Not a general-purpose library: the core reads one file format with it, so it needs no
// dependency a C++ host would have to provide.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kcap::json {

struct Value {
    enum class Kind { Null, Bool, Number, String, Array, Object };
    Kind kind = Kind::Null;
    bool boolean = false;
    std::string text;  // a Number's digits or a String's contents
    std::vector<Value> items;                            // Array
    std::vector<std::pair<std::string, Value>> members;  // Object, in file order

    // An object's member, or null when absent (also when this is not an object).
    const Value* find(const std::string& key) const;
};

constexpr int kMaxDepth = 64;

// Parses text; `what` names the document in errors (e.g. the file path).
Value parse(const std::string& text, const std::string& what);

// The JSON spelling of s, with its quotes (control characters, quote and backslash escaped).
std::string quote(const std::string& s);
// The shortest decimal that reads back as exactly `value` (strtof), e.g. "0.1", "1e-06".
std::string number(float value);

}  // namespace kcap::json
