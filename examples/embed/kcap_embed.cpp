// kcap_embed BUNDLE N ID [ID ...] [--backend B] [--ctx N]
//
// Loads a bundle written by `kcap export`, evaluates the prompt's token ids, and prints the
// next N greedy token ids separated by spaces: the first from the prompt's logits, the rest
// from Engine::decode_greedy (which, on CUDA, runs the whole loop on the device). Errors (a
// bundle that does not load, a model no kernel row can run, a token id outside the vocabulary)
// are kcap exceptions whose message is printed, as Python's kcap prints them.
#include <kcap/kcap.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

long long parse_integer(const char* text, const char* what) {
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (!*text || *end) throw kcap::ModelError(std::string(what) + " '" + text + "' is not an integer");
    return value;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    kcap::EngineOptions options;  // backend "cpu", the model's context, f32 KV and activations
    std::vector<std::string> positional;
    try {
        for (size_t i = 0; i < args.size(); ++i) {
            if ((args[i] == "--backend" || args[i] == "--ctx") && i + 1 < args.size()) {
                if (args[i] == "--backend") options.backend = args[++i];
                else options.n_ctx = parse_integer(args[++i].c_str(), "--ctx");
            } else {
                positional.push_back(args[i]);
            }
        }
        if (positional.size() < 3) {
            std::fprintf(stderr, "usage: kcap_embed BUNDLE N ID [ID ...] [--backend cpu|cuda|metal] [--ctx N]\n");
            return 2;
        }
        const kcap::Bundle bundle = kcap::load_bundle(positional[0]);
        const long long n = parse_integer(positional[1].c_str(), "N");
        if (n < 1) throw kcap::ModelError("N must be at least 1");
        std::vector<int32_t> prompt;
        for (size_t i = 2; i < positional.size(); ++i)
            prompt.push_back(int32_t(parse_integer(positional[i].c_str(), "token id")));

        kcap::Engine engine(bundle.spec, options);
        std::vector<float> logits(size_t(engine.n_vocab()));
        engine.eval(prompt.data(), int64_t(prompt.size()), logits.data(), /*all_logits=*/false);
        int32_t first = 0;  // the first maximum, as numpy's argmax
        for (int64_t v = 1; v < engine.n_vocab(); ++v)
            if (logits[size_t(v)] > logits[size_t(first)]) first = int32_t(v);
        std::vector<int32_t> ids{first};
        if (n > 1) {
            ids.resize(size_t(n));
            engine.decode_greedy(first, n - 1, ids.data() + 1);
        }
        for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
        std::printf("\n");
        return 0;
    } catch (const kcap::Error& e) {
        std::fprintf(stderr, "kcap_embed: error: %s\n", e.what());
        return 1;
    }
}
