/*
 * main.c - the `kettle` program: dispatches to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command COMMANDS[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"tokenize", cmd_tokenize, "show how a model's tokenizer splits a text"},
    {"chat", cmd_chat, "talk with a model, turn by turn, reusing its KV cache"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (streaming, many clients at once)"},
    {"template", cmd_template, "print the prompt a chat template renders for messages"},
    {"bench", cmd_bench, "measure prefill/decode speed and the machine's ceilings"},
    {"perplexity", cmd_perplexity, "score a text: perplexity, as llama-perplexity computes it"},
    {"pull", cmd_pull, "download a GGUF model from Hugging Face (OWNER/REPO:QUANT) or a URL"},
    {"ls", cmd_ls, "list the pulled models"},
    {"rm", cmd_rm, "delete a pulled model"},
    {"info", cmd_info, "print a GGUF file's metadata and tensors"},
    {"convert", cmd_convert, "convert a llama2.c checkpoint to GGUF"},
    {"quantize", cmd_quantize, "convert a GGUF model's weights to another TYPE (below)"},
    {"gen-model", cmd_gen_model, "write a random-weight model of a real shape"},
    {"devices", cmd_devices, "list the GPUs the CUDA backend sees, or say why none is usable"},
    {"version", cmd_version, "print the version, the git commit and the CPU kernels in use"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: kettle COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    /* from the table quantize parses with, so the list cannot fall behind it */
    fprintf(out, "\nquantize TYPE: %s,\n  or one of llama.cpp's mixes: %s\n", cmd_quantize_types(false),
            cmd_quantize_types(true));
    fprintf(out, "\n'kettle COMMAND --help' describes a command; 'kettle --version' prints the version.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kettle: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
