// The bundle manifest's JSON reader and writer (see json.h).
#include "core/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kcap/errors.h"

namespace kcap::json {

const Value* Value::find(const std::string& key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& [name, value] : members)
        if (name == key) return &value;
    return nullptr;
}

namespace {

class Parser {
public:
    Parser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

    Value document() {
        check_utf8();
        Value v = value(0);
        skip_space();
        if (pos_ != s_.size()) fail("the end of the document");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& expected) const {
        std::string found = "the end of the text";
        if (pos_ < s_.size()) {
            const unsigned char c = static_cast<unsigned char>(s_[pos_]);
            char buf[16];
            if (c >= 0x20 && c < 0x7F) std::snprintf(buf, sizeof buf, "'%c'", c);
            else std::snprintf(buf, sizeof buf, "byte 0x%02X", c);  // the message stays valid UTF-8
            found = buf;
        }
        throw ModelError(what_ + ": invalid JSON at byte " + std::to_string(pos_) + ": expected " + expected +
                         ", found " + found);
    }

    // JSON text is UTF-8 (RFC 8259): overlong forms, surrogates and code points past U+10FFFF
    // are refused, so every string handed on is valid UTF-8.
    void check_utf8() {
        const auto* p = reinterpret_cast<const unsigned char*>(s_.data());
        const size_t n = s_.size();
        for (size_t i = 0; i < n;) {
            const unsigned c = p[i];
            size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
            unsigned code = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
            bool ok = len > 0 && i + len <= n;
            for (size_t j = 1; ok && j < len; ++j) {
                ok = (p[i + j] & 0xC0) == 0x80;
                code = (code << 6) | (p[i + j] & 0x3F);
            }
            ok = ok && !(len == 2 && code < 0x80) && !(len == 3 && code < 0x800) && !(len == 4 && code < 0x10000) &&
                 !(code >= 0xD800 && code < 0xE000) && code <= 0x10FFFF;
            if (!ok) {
                pos_ = i;
                fail("UTF-8 text");
            }
            i += len;
        }
    }

    void skip_space() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
            ++pos_;
    }

    bool take(char c) {
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }

    void expect(char c) {
        if (!take(c)) fail(std::string("'") + c + "'");
    }

    void literal(const char* word) {
        for (const char* p = word; *p; ++p, ++pos_)
            if (pos_ >= s_.size() || s_[pos_] != *p) fail(std::string("'") + word + "'");
    }

    Value value(int depth) {
        if (depth > kMaxDepth) fail("at most " + std::to_string(kMaxDepth) + " levels of nesting");
        skip_space();
        if (pos_ >= s_.size()) fail("a value");
        Value v;
        const char c = s_[pos_];
        if (c == '{') {
            ++pos_;
            v.kind = Value::Kind::Object;
            if (take('}')) return v;
            do {
                skip_space();
                if (pos_ >= s_.size() || s_[pos_] != '"') fail("a member name");
                std::string key = string();
                if (v.find(key)) fail("a member name not used before in this object (\"" + key + "\" repeats)");
                expect(':');
                v.members.emplace_back(std::move(key), value(depth + 1));
            } while (take(','));
            expect('}');
        } else if (c == '[') {
            ++pos_;
            v.kind = Value::Kind::Array;
            if (take(']')) return v;
            do v.items.push_back(value(depth + 1));
            while (take(','));
            expect(']');
        } else if (c == '"') {
            v.kind = Value::Kind::String;
            v.text = string();
        } else if (c == 't') {
            literal("true");
            v.kind = Value::Kind::Bool;
            v.boolean = true;
        } else if (c == 'f') {
            literal("false");
            v.kind = Value::Kind::Bool;
        } else if (c == 'n') {
            literal("null");
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            v.kind = Value::Kind::Number;
            v.text = number_text();
        } else {
            fail("a value");
        }
        return v;
    }

    bool digit() const { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; }

    std::string number_text() {
        const size_t start = pos_;
        if (s_[pos_] == '-') ++pos_;
        if (!digit()) fail("a digit");
        if (s_[pos_] == '0') ++pos_;
        else
            while (digit()) ++pos_;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            ++pos_;
            if (!digit()) fail("a digit after the decimal point");
            while (digit()) ++pos_;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            ++pos_;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
            if (!digit()) fail("a digit of the exponent");
            while (digit()) ++pos_;
        }
        return s_.substr(start, pos_ - start);
    }

    unsigned hex4() {
        unsigned code = 0;
        for (int i = 0; i < 4; ++i, ++pos_) {
            if (pos_ >= s_.size()) fail("four hex digits");
            const char h = s_[pos_];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else fail("four hex digits");
        }
        return code;
    }

    static void append_utf8(std::string& out, unsigned code) {
        if (code < 0x80) {
            out += char(code);
        } else if (code < 0x800) {
            out += char(0xC0 | (code >> 6));
            out += char(0x80 | (code & 0x3F));
        } else if (code < 0x10000) {
            out += char(0xE0 | (code >> 12));
            out += char(0x80 | ((code >> 6) & 0x3F));
            out += char(0x80 | (code & 0x3F));
        } else {
            out += char(0xF0 | (code >> 18));
            out += char(0x80 | ((code >> 12) & 0x3F));
            out += char(0x80 | ((code >> 6) & 0x3F));
            out += char(0x80 | (code & 0x3F));
        }
    }

    std::string string() {
        ++pos_;  // the opening quote
        std::string out;
        while (true) {
            if (pos_ >= s_.size()) fail("'\"' closing the string");
            const unsigned char c = static_cast<unsigned char>(s_[pos_]);
            if (c == '"') {
                ++pos_;
                return out;
            }
            if (c < 0x20) fail("an escaped control character");
            if (c != '\\') {
                out += char(c);
                ++pos_;
                continue;
            }
            ++pos_;
            if (pos_ >= s_.size()) fail("an escape");
            const char e = s_[pos_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned code = hex4();
                    if (code >= 0xD800 && code < 0xDC00) {  // a high surrogate: its low half follows
                        if (pos_ + 1 >= s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
                            fail("the low surrogate of a \\u pair");
                        pos_ += 2;
                        const unsigned low = hex4();
                        if (low < 0xDC00 || low >= 0xE000) fail("a low surrogate (\\uDC00 .. \\uDFFF)");
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    } else if (code >= 0xDC00 && code < 0xE000) {
                        fail("a high surrogate before a low one");
                    }
                    append_utf8(out, code);
                    break;
                }
                default: --pos_; fail("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
            }
        }
    }

    const std::string& s_;
    const std::string& what_;
    size_t pos_ = 0;
};

}  // namespace

Value parse(const std::string& text, const std::string& what) { return Parser(text, what).document(); }

std::string quote(const std::string& s) {
    std::string out = "\"";
    for (const char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    return out + "\"";
}

std::string number(float value) {
    if (!std::isfinite(value)) throw ModelError("JSON has no spelling for the number " + std::to_string(value));
    char buf[32];
    if (value == std::trunc(value) && std::fabs(value) < 1e9f && !std::signbit(value)) {  // 10000, not 1e+04
        std::snprintf(buf, sizeof buf, "%.0f", double(value));
        return buf;
    }
    for (int digits = 1; digits <= 9; ++digits) {  // 9 significant digits always read back exactly
        std::snprintf(buf, sizeof buf, "%.*g", digits, double(value));
        const float back = std::strtof(buf, nullptr);
        if (std::memcmp(&back, &value, sizeof value) == 0) break;  // bit for bit: -0 stays -0
    }
    return buf;
}

}  // namespace kcap::json
