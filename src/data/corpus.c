/* The builtin corpus: a small English-like language from a probabilistic
 * grammar, so that a fresh checkout can train with no data file and a person
 * can read what the model learned. The structure is learnable at several
 * scales: spelling (a fixed word list), word choice (Zipf), agreement (a
 * plural subject takes the plural verb, "a" becomes "an" before a vowel),
 * and sentence shape (capital, clause, full stop, paragraphs). */
#include <string.h>

#include "hypershard/data.h"

/* Fixed: the corpus is a constant of the program, not of the run. */
#define CORPUS_SEED 0x5eed0c0a7ull

typedef struct pair {
    const char *one, *many;
} pair;

static const pair nouns[] = {
    {"cat", "cats"},       {"dog", "dogs"},         {"bird", "birds"},     {"child", "children"},
    {"man", "men"},        {"woman", "women"},      {"fox", "foxes"},      {"mouse", "mice"},
    {"horse", "horses"},   {"teacher", "teachers"}, {"farmer", "farmers"}, {"king", "kings"},
    {"queen", "queens"},   {"owl", "owls"},         {"apple", "apples"},   {"river", "rivers"},
    {"tree", "trees"},     {"house", "houses"},     {"boat", "boats"},     {"friend", "friends"},
    {"robot", "robots"},   {"baker", "bakers"},     {"sheep", "sheep"},    {"wolf", "wolves"},
    {"girl", "girls"},     {"boy", "boys"},         {"stone", "stones"},   {"letter", "letters"},
    {"garden", "gardens"}, {"city", "cities"},      {"song", "songs"},     {"book", "books"},
};

static const pair verbs_transitive[] = {
    {"sees", "see"},      {"likes", "like"},   {"chases", "chase"},  {"finds", "find"},
    {"watches", "watch"}, {"helps", "help"},   {"carries", "carry"}, {"follows", "follow"},
    {"paints", "paint"},  {"builds", "build"}, {"reads", "read"},    {"knows", "know"},
    {"feeds", "feed"},    {"visits", "visit"}, {"hears", "hear"},    {"loves", "love"},
};

static const pair verbs_intransitive[] = {
    {"sleeps", "sleep"}, {"runs", "run"},       {"sings", "sing"},   {"waits", "wait"},
    {"laughs", "laugh"}, {"swims", "swim"},     {"dances", "dance"}, {"falls", "fall"},
    {"smiles", "smile"}, {"listens", "listen"},
};

static const char *const adjectives[] = {
    "small", "big",    "old",   "quick", "happy", "quiet", "red",    "green",
    "angry", "little", "brave", "tired", "early", "young", "orange", "clever",
};

static const char *const adverbs[] = {
    "slowly", "quickly", "again", "today", "loudly", "softly", "often", "alone",
};

static const char *const prepositions[] = {
    "near", "under", "behind", "with", "in", "over", "beside", "across",
};

static const char *const det_one[] = {"the", "a", "this", "every", "my", "one", "that"};
static const char *const det_many[] = {"the", "some", "many", "these", "two", "my", "all"};

static const char *const names[] = {"Anna", "Tom", "Mia", "Leo", "Ada", "Sam"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct gen {
    uint8_t *out;
    size_t n, len;
    uint64_t draw; /* next RNG index */
    bool capital;  /* next letter starts a sentence */
} gen;

static float gen_uniform(gen *g) { return hs_rng_uniform(CORPUS_SEED, 1, g->draw++); }

/* Zipf(1) over n choices: weight of rank i is 1/(i+1). */
static int gen_zipf(gen *g, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += 1.0 / (i + 1);
    double u = gen_uniform(g) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += 1.0 / (i + 1);
        if (u < acc) return i;
    }
    return n - 1;
}

static bool gen_chance(gen *g, float p) { return gen_uniform(g) < p; }

static void gen_byte(gen *g, uint8_t c) {
    if (g->len < g->n) g->out[g->len] = c;
    g->len++;
}

static void gen_word(gen *g, const char *w) {
    for (const char *p = w; *p; p++) {
        uint8_t c = (uint8_t)*p;
        if (g->capital && c >= 'a' && c <= 'z') c = (uint8_t)(c - 'a' + 'A');
        g->capital = false;
        gen_byte(g, c);
    }
}

static void gen_space_word(gen *g, const char *w) {
    gen_byte(g, ' ');
    gen_word(g, w);
}

static bool starts_with_vowel(const char *w) { return strchr("aeiou", w[0]) != NULL; }

/* det [adj] noun; returns whether it is plural. `first` is the sentence's
 * first word (no leading space). */
static bool gen_noun_phrase(gen *g, bool first) {
    bool plural = gen_chance(g, 0.35f);
    const char *det = plural ? det_many[gen_zipf(g, COUNT(det_many))]
                             : det_one[gen_zipf(g, COUNT(det_one))];
    const char *adj = gen_chance(g, 0.45f) ? adjectives[gen_zipf(g, COUNT(adjectives))] : NULL;
    const pair *noun = &nouns[gen_zipf(g, COUNT(nouns))];
    const char *head = adj ? adj : (plural ? noun->many : noun->one);
    if (!strcmp(det, "a") && starts_with_vowel(head)) det = "an";
    if (first) gen_word(g, det);
    else gen_space_word(g, det);
    if (adj) gen_space_word(g, adj);
    gen_space_word(g, plural ? noun->many : noun->one);
    return plural;
}

static void gen_clause(gen *g, bool first) {
    bool plural;
    if (gen_chance(g, 0.12f)) {
        const char *name = names[gen_zipf(g, COUNT(names))];
        if (first) gen_word(g, name);
        else gen_space_word(g, name);
        plural = false;
    } else {
        plural = gen_noun_phrase(g, first);
    }
    if (gen_chance(g, 0.6f)) {
        const pair *v = &verbs_transitive[gen_zipf(g, COUNT(verbs_transitive))];
        gen_space_word(g, plural ? v->many : v->one);
        gen_noun_phrase(g, false);
    } else {
        const pair *v = &verbs_intransitive[gen_zipf(g, COUNT(verbs_intransitive))];
        gen_space_word(g, plural ? v->many : v->one);
        if (gen_chance(g, 0.5f)) gen_space_word(g, adverbs[gen_zipf(g, COUNT(adverbs))]);
    }
    if (gen_chance(g, 0.3f)) {
        gen_space_word(g, prepositions[gen_zipf(g, COUNT(prepositions))]);
        gen_noun_phrase(g, false);
    }
}

static void gen_sentence(gen *g) {
    g->capital = true;
    gen_clause(g, true);
    if (gen_chance(g, 0.2f)) {
        gen_space_word(g, gen_chance(g, 0.5f) ? "and" : "but");
        gen_clause(g, false);
    }
    gen_byte(g, '.');
}

void hs_corpus_builtin(uint8_t *out, size_t n) {
    gen g = {.out = out, .n = n};
    int in_paragraph = 0;
    while (g.len < n) {
        gen_sentence(&g);
        in_paragraph++;
        /* Paragraphs of 3-8 sentences. */
        if (in_paragraph >= 3 && gen_chance(&g, 0.25f)) {
            gen_byte(&g, '\n');
            in_paragraph = 0;
        } else {
            gen_byte(&g, ' ');
        }
    }
}
